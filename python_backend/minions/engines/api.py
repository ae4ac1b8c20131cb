"""What an engine is: the capabilities an engine may have, over the call of decoding/engine_call.py.

Every engine serves `Engine` (one call, and the release of a finished sequence's state). The others
are capabilities the Triton adapter (triton/engine_model.py) checks for by name instead of probing
attributes: a whole dynamic batch in one call, in-flight batching, and the state its metrics read
(cached sequences and batching, prefix-cache hits).
The tensors these requests travel in are engines/tensors.py's.

Semantics kept from TensorRT-LLM:
- `input_ids` is the whole sequence so far (the orchestrator resends it every round).
- without `draft`: generate `request_output_len` tokens.
- with `draft` (k tokens, `request_output_len` = k + 1): verify the draft and return the accepted
  draft tokens plus one token of the engine's own (draft-tokens-external mode); with `draft_logits`
  too, the draft counts as sampled from them (see decoding/verification.py).
- `streaming` (a generation on an in-flight engine): each token is answered as it is made, in a
  result with `final` false, and the last one in the final result (as tensorrt_llm streams).
- `stop` = true ends the sequence `request_id` names and frees its cached state; on an in-flight
  engine it also ends a streaming generation of that sequence at its next step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.prefix_cache import PrefixCacheStats
from minions.engines.sequence_cache import SequenceCache


WARM_UP_TOKENS = 16
"""Tokens an engine decodes once at load and forgets (llama-server's warm-up), so that the first
request does not wait for the weights to be paged in or the kernels to be set up: more than one, so
that the batched kernels run too (docs/engines.md, "Warm-up at load")."""


@dataclass
class BatchStats:
    """What batching achieved, for the engine's metrics: mean batch = sequences / passes, padding share =
    pad_tokens / tokens."""

    passes: int = 0
    sequences: int = 0
    tokens: int = 0
    pad_tokens: int = 0


Answer = Callable[[EngineResult | Exception], None]
"""Receives one call's result, or the exception it failed with; for a streaming call, first its
partial results (`final` false)."""


def result_or_raise(value: EngineResult | Exception) -> EngineResult:
    """One call's answer as a result, its failure as a raised exception."""
    if isinstance(value, Exception):
        raise value
    return value


@runtime_checkable
class Engine(Protocol):
    """What every engine serves: one call, and the release of a finished sequence's state."""

    def generate(self, request: EngineRequest) -> EngineResult: ...

    def release(self, request_id: str) -> None: ...


@runtime_checkable
class BatchEngine(Engine, Protocol):
    """An engine that serves Triton's whole dynamic batch in one call (one forward or decode step for
    all); a failing request gets its exception in its place, the others their results."""

    def generate_batch(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]: ...


@runtime_checkable
class InflightEngine(BatchEngine, Protocol):
    """An engine that batches in flight, for a decoupled model: `submit` returns at once and each call's
    answer comes from the engine's thread when done; `cancel` ends submitted calls early (their client
    has gone), answered with RequestCancelled; `close` stops that thread."""

    def submit(self, calls: list[tuple[EngineRequest, Answer]]) -> None: ...

    def cancel(self, requests: list[EngineRequest]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class MeteredEngine(Protocol):
    """An engine that keeps per-sequence state and counts its passes: what the engine model's metrics
    read (cached sequences, BatchStats, and the bytes its KV caches hold, None where it cannot tell)."""

    cache: SequenceCache[Any]
    stats: BatchStats

    def cached_bytes(self) -> int | None: ...


@runtime_checkable
class PrefixCachingEngine(Protocol):
    """An engine whose new requests share the KV of cached prefixes: what its prefix-cache counters read."""

    prefix_stats: PrefixCacheStats


class SplitBatchEngine:
    """Base of the engines that compute a batch in passes over distinct request ids (TorchEngine): it
    serves `BatchEngine` over the subclass's `_generate_distinct` and `release`."""

    def generate(self, request: EngineRequest) -> EngineResult:
        return result_or_raise(self.generate_batch([request])[0])

    def generate_batch(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]:
        """Two calls for one sequence (a pipelined early draft and the regular draft that replaced it)
        can land in one batch: the later call runs in a second pass, after the first, so each sees its
        own prefix. Releases (`stop`) are applied after the batch's work: a release is always a
        request's last call."""
        out: list[EngineResult | Exception | None] = [None] * len(requests)
        seen: set[str] = set()
        first, later, stops = [], [], []
        for i, r in enumerate(requests):
            if r.stop:
                stops.append(i)
            else:
                (later if r.request_id in seen else first).append(i)
                seen.add(r.request_id)
        for part in (first, later):
            if part:
                for i, result in zip(part, self._generate_distinct([requests[i] for i in part])):
                    out[i] = result
        for i in stops:
            if not requests[i].keep_sequence:  # an interrupt: no stream runs here to end
                self.release(requests[i].request_id)
            out[i] = EngineResult([])
        return out  # type: ignore[return-value]

    def release(self, request_id: str) -> None:
        raise NotImplementedError

    def _generate_distinct(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]:
        """Serve requests with distinct ids, none of them a release."""
        raise NotImplementedError
