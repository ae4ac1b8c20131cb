"""The torch engine batched in flight, for a decoupled Triton model."""

from __future__ import annotations

from minions.engines.batched_calls import BatchedCalls
from minions.engines.inflight_batching import InflightBatcher
from minions.engines.torch_engine import TorchEngine


class InflightTorchEngine(BatchedCalls):
    """A TorchEngine batched in flight (InflightEngine, MeteredEngine, PrefixCachingEngine): a decoupled
    model's calls join the running passes at the next step instead of waiting for a batch's longest
    generation to end, as LlamaCppEngine's do (inflight_batching.py). Under Triton's dynamic batching
    alone, `off` at 8 streams ran passes of 4 rows on average."""

    def __init__(self, engine: TorchEngine, capacity: int) -> None:
        self.engine = engine
        self.cache, self.stats, self.prefix_stats = engine.cache, engine.stats, engine.prefix_stats
        self.batcher = InflightBatcher(engine, capacity, name="torch")

    def close(self) -> None:
        self.batcher.close()

    def cached_bytes(self) -> int:
        return self.engine.cached_bytes()
