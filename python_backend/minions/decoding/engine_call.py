"""One call to an engine model: what is asked (`EngineRequest`), what comes back (`EngineResult`), and
how the decode loop makes it (`EngineClient`).

The orchestrator builds these, the engines serve them, and engines/tensors.py carries them in
tensorrt_llm's tensors. Semantics kept from TensorRT-LLM are listed in engines/api.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import Randomness, SamplingParams, generator_at, log_prob, pick_token
from minions.text.bad_words import BadWords


STREAM_INTERVAL_PARAMETER = "stream_interval_ms"
"""The Triton request parameter that carries EngineRequest.stream_interval_s (in ms) to our engine models."""
KEEP_SEQUENCE_PARAMETER = "keep_sequence"
"""The Triton request parameter that carries EngineRequest.keep_sequence to our engine models."""


@dataclass
class EngineRequest:
    request_id: str
    input_ids: list[int]
    request_output_len: int
    draft: list[int] = field(default_factory=list)
    draft_logits: np.ndarray | None = None
    """[len(draft), vocab]: the SSM's logits when it sampled the draft."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    """The request's seed, the same for each of its calls: our engines key the draw at each position
    by it (sampling.SeededDraws); TensorRT-LLM's own model gets one per call (sampling.native_seed)."""
    end_id: int | None = None
    pad_id: int = 0
    bad_words: BadWords = field(default_factory=lambda: BadWords([]))
    penalties: Penalties = NO_PENALTIES
    return_log_probs: bool = False
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    exclude_input_in_output: bool = False
    streaming: bool = False
    stream_interval_s: float = 0.0
    """A streaming call's tokens after its first go out at most this often (0: every token, as
    tensorrt_llm streams); a request parameter (STREAM_INTERVAL_PARAMETER), not a tensor."""
    stop: bool = False
    keep_sequence: bool = False
    """With `stop`: end the sequence's running call, but keep its state for the sequence's next call
    instead of freeing it (a stream left early to verify a draft); a request parameter
    (KEEP_SEQUENCE_PARAMETER), not a tensor."""
    ends_sequence: bool = False
    """A whole request (a tensorrt_llm client's, naming no sequence): an in-flight engine frees its
    sequence as it answers the call, before it takes the next call of the same id. (A release sent
    after the answer could meet the next request of a client that reuses its request id, and end it.)"""

    @classmethod
    def release(cls, request_id: str) -> EngineRequest:
        """The call that ends sequence `request_id` and frees its state (tensorrt_llm's `stop`). It
        computes nothing; its answer is empty (no tokens, and the input excluded from the output)."""
        return cls(request_id, [0], 1, stop=True, exclude_input_in_output=True)

    @classmethod
    def interrupt(cls, request_id: str) -> EngineRequest:
        """The call that ends sequence `request_id`'s running call (a stream) before its next step and
        keeps the sequence's state, so that its next call continues from every token made. Its answer
        is empty."""
        return cls(request_id, [0], 1, stop=True, keep_sequence=True, exclude_input_in_output=True)

    @property
    def shares_prefix(self) -> bool:
        """Whether the engine may start this sequence from another's cached prefix, and keep it for later
        ones. Not a seeded sampled request's: a cached prefix rounds its logits otherwise than a
        recomputed one, and a repeated seed must repeat its draws."""
        return self.seed is None or self.sampling.greedy

    def next_token(self, logits: np.ndarray, sequence: list[int], rng: Randomness) -> int:
        """The next generated token after `sequence`: drawn with the request's sampling and penalties, bad
        words banned."""
        banned = self.bad_words.banned_next(sequence) if self.bad_words else None
        return pick_token(self.penalties.apply(logits, sequence, self.end_id), self.sampling,
                          generator_at(rng, len(sequence)), banned)

    def log_probs(self, rows, tokens: list[int]) -> list[float] | None:
        """The tokens' log probabilities from their logit rows, when the request asks for them."""
        return [log_prob(row, t) for row, t in zip(rows, tokens)] if self.return_log_probs else None

    def generation_done(self, tokens: list[int]) -> bool:
        """Whether a generation that has produced `tokens` is over: request_output_len reached, or end_id."""
        return len(tokens) >= self.request_output_len or (
            self.end_id is not None and bool(tokens) and tokens[-1] == self.end_id)


@dataclass
class EngineResult:
    tokens: list[int]
    """New tokens only (accepted draft tokens + the engine's own, or the generated ones)."""
    logits: np.ndarray | None = None
    """[len(tokens), vocab] generation logits when asked for."""
    log_probs: list[float] | None = None
    """Each token's log probability (sampling.log_prob) when asked for; None from engines without logits."""
    final: bool = True
    """False for the partial results of a streaming generation: more follow."""
    cached_tokens: int = 0
    """Tokens of input_ids the engine found in the sequence's cache and did not compute again."""


class EngineClient(Protocol):
    """How the loop reaches engine models (calls through Triton in production, objects in tests)."""

    async def generate(self, model: str, request: EngineRequest) -> EngineResult: ...

    def stream(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        """A streaming generation's results, a token each, from one call to an in-flight engine.
        Closing the iterator early ends the generation and frees the sequence's state."""
        ...

    async def release(self, model: str, request_id: str) -> None: ...

    async def interrupt(self, model: str, request_id: str) -> None:
        """End the sequence's running call (EngineRequest.interrupt); best effort, as a release."""
        ...
