"""What the decode loop is given for one request (`DecodeRequest`), and the LLM calls it makes of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import GREEDY, SamplingParams
from minions.settings import DEFAULTS
from minions.speculation.mode import Speculation
from minions.text.bad_words import BadWords


@dataclass(kw_only=True)
class DecodeRequest:
    """One request: what to decode and how. How to speculate has no default here: serving/flow.py
    fills it from the parsed request, whose defaults are the deployment's (serving/inputs.py)."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    penalties: Penalties = NO_PENALTIES
    """Applied by the LLM alone, to plain tokens and every verified position (decoding/penalties.py)."""
    seed: int | None = None
    end_id: int | None = None
    bad_words: BadWords = field(default_factory=lambda: BadWords([]))
    speculation: Speculation
    num_draft_tokens: int | None
    """Draft length per round; None: the adaptive selector chooses it (up to max_draft_tokens)."""
    max_draft_tokens: int = DEFAULTS.limits.num_draft_tokens
    stream_interval_s: float
    """How often the LLM sends a streamed stretch's tokens after the first (EngineRequest.stream_interval_s;
    the deployment's llm_stream_interval_ms)."""
    use_draft_logits: bool
    """When sampling: the SSM samples its draft with the request's parameters and sends its logits,
    and the LLM verifies with the min(1, p/q) rule (ignored for greedy decoding and for SSMs that
    have no logits, whose drafts are then judged as deterministic)."""
    pipeline: bool
    """Draft round r+1 while the LLM verifies round r (pipelining.py)."""
    return_log_probs: bool = False
    """The LLM reports each emitted token's log probability (Round.log_probs)."""

    @property
    def sampled_drafts(self) -> bool:
        return self.use_draft_logits and not self.sampling.greedy

    def llm_call(self, request_id: str, sequence: list[int], tokens: int, draft: list[int] | None = None,
                 draft_logits: np.ndarray | None = None, streaming: bool = False,
                 stream_interval_s: float | None = None) -> EngineRequest:
        """The one shape of this request's LLM calls: up to `tokens` new tokens after `sequence` (a
        verification of `draft` returns its accepted prefix and one token of the LLM's own), with the
        request's sampling, penalties, bad words, end and seed; a stream's interval is the request's
        unless given."""
        return EngineRequest(
            request_id, list(sequence), tokens, draft=list(draft or []), draft_logits=draft_logits,
            sampling=self.sampling, seed=self.seed, end_id=self.end_id,
            bad_words=self.bad_words, penalties=self.penalties, return_log_probs=self.return_log_probs,
            # The first call (the prompt) reports the prompt's tokens the LLM found cached (Round.cached_tokens).
            return_perf_metrics=len(sequence) == len(self.prompt_ids),
            exclude_input_in_output=True, streaming=streaming,
            stream_interval_s=self.stream_interval_s if stream_interval_s is None else stream_interval_s)
