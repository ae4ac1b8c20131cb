"""The CUDA-graph path without a GPU: which bucket a step takes, how it is laid out in one (padding to
the scratch block), which buckets a memory budget captures, and a whole bucketed step run eagerly
(DenseRunner, what a graph replays) against the eager packed step."""

from __future__ import annotations

import numpy as np
import pytest

from minions.engines.cuda_graphs import DenseRunner, graph_limits
from minions.engines.graph_plan import (ROW_BUCKETS, SPAN_BUCKETS, WIDTH_BUCKETS, Bucket, bucket_for,
                                        captured_buckets, dense_step)
from minions.engines.packed_forward import ForwardRow, PackedLlamaForward
from minions.engines.step_plan import RowSpec
from tiny_models import full_logits

LIMITS = Bucket(16, 32, 2048)


def test_a_step_takes_the_smallest_bucket_that_holds_it_and_a_prefill_none():
    rows = [RowSpec(10, 1, (1,)), RowSpec(200, 1, (2, 3)), RowSpec(290, 5, (4, 5, 6))]
    assert bucket_for(rows, LIMITS) == Bucket(4, 8, 512)
    assert bucket_for([RowSpec(0, 40, (1,))], LIMITS) is None  # longer than any width: eager
    assert bucket_for([RowSpec(0, 1, (1,))] * 17, LIMITS) is None  # more rows than the limit
    assert bucket_for([RowSpec(2047, 1, (1,) * 16)], LIMITS) == Bucket(1, 1, 2048)
    assert bucket_for([RowSpec(2048, 1, (1,) * 17)], LIMITS) is None  # past the context


def test_plain_decoding_s_buckets_are_captured_first_within_the_budget():
    every = captured_buckets(LIMITS, 10**12, lambda b: 1)
    assert len(every) == 5 * 6 * 4 and every[0] == Bucket(1, 1, 256)
    assert {b.width for b in every[:20]} == {1}  # every plain-decoding bucket before any draft's
    plain = captured_buckets(LIMITS, 4 * 31 * 10, lambda b: b.tokens * 10)  # 31 rows a span, 4 spans
    assert plain == every[:20]
    assert sum(b.tokens for b in captured_buckets(LIMITS, 1000, lambda b: b.tokens * 10)) * 10 <= 1000
    assert graph_limits(16, 16, 2048) == LIMITS and graph_limits(3, 0, 100) == Bucket(4, 1, 256)
    assert max(ROW_BUCKETS) >= 64 and WIDTH_BUCKETS[0] == 1 and SPAN_BUCKETS[0] == 256


def test_a_step_is_laid_out_with_its_padding_in_the_scratch_block():
    rows = [RowSpec(5, 2, (7, 1)), RowSpec(0, 1, (3,))]
    step = dense_step(rows, [[11, 12], [13]], [2, 1], Bucket(4, 2, 16), block_tokens=4, scratch_block=0)
    assert step.ids.tolist() == [11, 12, 13, 0, 0, 0, 0, 0]
    assert step.positions[:3].tolist() == [5, 6, 0]
    assert step.writes[:3].tolist() == [1 * 4 + 1, 1 * 4 + 2, 3 * 4 + 0]
    assert all(w < 4 for w in step.writes[3:])  # padding tokens and rows: the scratch block
    assert step.gather[0, :7].tolist() == [28, 29, 30, 31, 4, 5, 6] and not step.gather[0, 7:].any()
    assert step.mask[0, 0, 1].sum() == 7 and step.mask[1, 0, 1].tolist() == [True] + [False] * 15
    assert step.mask[2, 0].sum() == 2  # a padding row's queries see key 0 alone
    assert [r.tolist() for r in step.logit_rows] == [[0, 1], [2]]


def _decode(forward: PackedLlamaForward, prompts: list[list[int]], drafts: list[list[list[int]]]):
    states = [forward.new_state() for _ in prompts]
    out = [forward.forward([ForwardRow(s, p, 1) for s, p in zip(states, prompts)])]
    for step in drafts:
        out.append(forward.forward([ForwardRow(s, d, len(d)) for s, d in zip(states, step)]))
    return out


def test_a_bucketed_step_computes_what_the_eager_step_does(tiny_llm):
    """Prefills eagerly (no bucket holds them), then ragged verification and plain steps through the
    dense runner; each logit row against the eager packed step's and a from-scratch forward."""
    prompts = [[3, 7, 1, 9, 4], [0, 0, 5], [12, 2, 8, 8, 1, 6, 15]]
    drafts = [[[1, 2, 3], [4], [5, 6]], [[7], [8], [9]], [[1, 1, 1, 1, 1], [2, 2], [3]]]
    eager = _decode(PackedLlamaForward(tiny_llm), prompts, drafts)
    dense = PackedLlamaForward(tiny_llm)
    limits = Bucket(4, 8, 256)
    dense.runner = DenseRunner(dense, captured_buckets(limits, 10**12, lambda b: 1), limits)
    got = _decode(dense, prompts, drafts)
    for step_eager, step_dense in zip(eager, got):
        for a, b in zip(step_eager, step_dense):
            np.testing.assert_allclose(b, a, atol=1e-5)
    sequence = prompts[0] + drafts[0][0] + drafts[1][0] + drafts[2][0]
    np.testing.assert_allclose(got[-1][0], full_logits(tiny_llm, sequence)[-5:], atol=1e-5)


def test_once_the_pool_has_grown_every_step_runs_eagerly(tiny_llm):
    forward = PackedLlamaForward(tiny_llm, pool_blocks=2)
    forward.runner = DenseRunner(forward, [Bucket(1, 1, 256)], Bucket(1, 1, 256))
    assert forward.runner.bucket([RowSpec(3, 1, (1,))], forward.pool) == Bucket(1, 1, 256)
    forward.pool.allocate(5)
    assert forward.runner.bucket([RowSpec(3, 1, (1,))], forward.pool) is None


@pytest.mark.parametrize("rows", [1, 3])
def test_an_engine_off_cuda_captures_nothing(tiny_llm, rows):
    from minions.engines.torch_engine import TorchEngine

    engine = TorchEngine(tiny_llm, max_sequences=4, kv_budget_bytes=2**20, graph_rows=rows)
    assert engine.backend.runner is None
