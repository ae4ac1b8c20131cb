"""Steps laid out in buckets (graph_plan.py), run by a runner that PackedLlamaForward hands them to.

- `DenseRunner` computes a bucketed step eagerly (`PackedLlamaForward.dense_hidden`): on the CPU it is
  what the tests run, so bucket choice, static layout, padding and the fallback are covered there.
- `CudaGraphRunner` captures `dense_hidden` once per bucket at load (CUDA only), all graphs in one
  memory pool, and replays them: a step costs a few host-to-device copies and one graph launch instead
  of thousands of kernel launches. A capture that fails leaves that bucket to the eager path.

A step no captured bucket holds (a prefill, more rows or a longer context) runs eagerly, as does every
step once the KV pool has grown (the graphs hold its old tensors): size the pool at load (the engine
does, from its KV budget)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from minions.engines.graph_plan import Bucket, DenseStep, bucket_for, captured_buckets
from minions.engines.step_plan import RowSpec

if TYPE_CHECKING:
    from minions.engines.kv_pool import KvPool
    from minions.engines.packed_forward import PackedLlamaForward

log = logging.getLogger(__name__)


class DenseRunner:
    """Runs bucketed steps eagerly (see the module docstring)."""

    def __init__(self, forward: PackedLlamaForward, buckets: list[Bucket], limits: Bucket) -> None:
        self.forward = forward
        self.buckets = set(buckets)
        self.limits = limits
        self.grown = forward.pool.grown

    def bucket(self, rows: list[RowSpec], pool: KvPool) -> Bucket | None:
        """The step's bucket where it has one; None: run it eagerly."""
        if pool.grown != self.grown:
            if self.buckets:
                log.warning("the KV pool grew past its size at load: every step now runs eagerly")
                self.buckets = set()
            return None
        bucket = bucket_for(rows, self.limits)
        return bucket if bucket in self.buckets else None

    def run(self, step: DenseStep) -> torch.Tensor:
        """The step's final hidden states, [rows * width, hidden], on the model's device."""
        return self.forward.dense_hidden(*self.inputs(step), step.bucket.rows, step.bucket.width)

    def inputs(self, step: DenseStep) -> list[torch.Tensor]:
        device = self.forward.device
        return [torch.from_numpy(a).to(device) for a in (step.ids, step.positions, step.writes, step.gather, step.mask)]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    output: torch.Tensor


class CudaGraphRunner(DenseRunner):
    """Replays a CUDA graph per bucket (see the module docstring)."""

    def __init__(self, forward: PackedLlamaForward, buckets: list[Bucket], limits: Bucket) -> None:
        super().__init__(forward, buckets, limits)
        self.graphs: dict[Bucket, _Graph] = {}
        pool = torch.cuda.graph_pool_handle()
        for bucket in sorted(buckets, reverse=True):  # the largest first: the smaller reuse its memory
            try:
                self.graphs[bucket] = self._capture(bucket, pool)
            except Exception:  # that bucket's steps run eagerly
                log.exception("capturing a CUDA graph for %s failed", bucket)
        self.buckets = set(self.graphs)
        log.info("%d CUDA graphs captured (rows x tokens x span up to %s)", len(self.graphs), limits)

    @torch.inference_mode()
    def _capture(self, bucket: Bucket, pool) -> _Graph:
        device = self.forward.device
        tokens = bucket.tokens
        inputs = [torch.zeros(tokens, dtype=torch.long, device=device),  # ids
                  torch.zeros(tokens, dtype=torch.long, device=device),  # positions
                  torch.zeros(tokens, dtype=torch.long, device=device),  # writes: the scratch block's first position
                  torch.zeros(bucket.rows, bucket.span, dtype=torch.long, device=device),  # gather
                  torch.ones(bucket.rows, 1, bucket.width, bucket.span, dtype=torch.bool, device=device)]  # mask
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # kernels pick their algorithms before the capture
            for _ in range(2):
                self.forward.dense_hidden(*inputs, bucket.rows, bucket.width)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = self.forward.dense_hidden(*inputs, bucket.rows, bucket.width)
        return _Graph(graph, inputs, output)

    def run(self, step: DenseStep) -> torch.Tensor:
        captured = self.graphs[step.bucket]
        for tensor, array in zip(captured.inputs, (step.ids, step.positions, step.writes, step.gather, step.mask)):
            tensor.copy_(torch.from_numpy(array), non_blocking=False)
        captured.graph.replay()
        return captured.output


def graph_limits(rows: int, draft_tokens: int, context: int) -> Bucket:
    """The largest bucket worth capturing: the engine's rows a step, a draft and its token, its context."""
    from minions.engines.graph_plan import ROW_BUCKETS, SPAN_BUCKETS, WIDTH_BUCKETS

    def cover(value: int, buckets: tuple[int, ...]) -> int:
        return next((b for b in buckets if b >= value), buckets[-1])

    return Bucket(cover(rows, ROW_BUCKETS), cover(draft_tokens + 1, WIDTH_BUCKETS), cover(context, SPAN_BUCKETS))


def bucket_bytes(forward: PackedLlamaForward, bucket: Bucket) -> int:
    """What a captured bucket holds on the GPU, counted as if alone: its inputs and output, and the peak of
    one layer (gathered keys and values, attention scores, the MLP's activations)."""
    element = torch.finfo(forward.dtype).bits // 8
    config = forward.model.config
    tokens, kv = bucket.tokens, bucket.rows * bucket.span * forward.kv_heads * forward.head_dim
    inputs = 8 * (3 * tokens + bucket.rows * bucket.span) + bucket.rows * bucket.width * bucket.span
    layer = (2 * kv + bucket.rows * forward.heads * bucket.width * bucket.span + 3 * tokens * config.intermediate_size
             + 4 * tokens * config.hidden_size) * element
    return inputs + tokens * config.hidden_size * element + layer


def cuda_graph_runner(forward: PackedLlamaForward, rows: int, draft_tokens: int, context: int,
                      budget_bytes: int) -> CudaGraphRunner | None:
    """Graphs for the buckets that fit the budget, plain decoding's first; None off CUDA."""
    if forward.device.type != "cuda":
        return None
    limits = graph_limits(rows, draft_tokens, context)
    buckets = captured_buckets(limits, budget_bytes, lambda b: bucket_bytes(forward, b))
    return CudaGraphRunner(forward, buckets, limits) if buckets else None

