"""The InflightEngine calls (engines/api.py) of an engine that steps every call on an InflightBatcher."""

from __future__ import annotations

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.api import Answer, result_or_raise
from minions.engines.inflight_batching import InflightBatcher


class BatchedCalls:
    """The InflightEngine calls (engines/api.py) of an engine whose `batcher` steps every call."""

    batcher: InflightBatcher

    def generate(self, request: EngineRequest) -> EngineResult:
        return result_or_raise(self.batcher.run([request])[0])

    def generate_batch(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]:
        return self.batcher.run(requests)

    def submit(self, calls: list[tuple[EngineRequest, Answer]]) -> None:
        """Queue calls and return at once; each answer comes from the batcher's thread when done."""
        self.batcher.submit(calls)

    def cancel(self, requests: list[EngineRequest]) -> None:
        """End submitted calls before the next step (their client has gone)."""
        self.batcher.cancel(requests)

    def release(self, request_id: str) -> None:
        """The id is done, after any call of it still queued or running (its state freed or kept)."""
        result_or_raise(self.batcher.run([EngineRequest.release(request_id)])[0])
