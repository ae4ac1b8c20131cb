"""The packed forward's step over a paged KV pool: the step plan's indices, one attention call per
group whatever the rows and drafts (operators counted, not timed), and the pool's blocks."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from minions.engines.dispatch_count import DispatchCount
from minions.engines.kv_pool import BLOCK_TOKENS
from minions.engines.packed_forward import ForwardRow, PackedLlamaForward
from minions.engines.step_plan import SHORT_ROW_TOKENS, RowSpec, plan_step
from tiny_models import full_logits


def test_a_plan_writes_each_token_to_its_own_block_and_gathers_each_row_s_positions():
    rows = [RowSpec(5, 1, (7, 1)), RowSpec(3, 4, (2, 9)), RowSpec(0, 40, tuple(range(10, 20)))]
    plan = plan_step(rows, block_tokens=4)  # tiny blocks, so rows cross them
    assert plan.positions.tolist() == [5, 3, 4, 5, 6, *range(40)]
    assert plan.writes[:5].tolist() == [1 * 4 + 1, 2 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1, 9 * 4 + 2]
    assert plan.writes[5:].tolist() == list(range(40, 80))
    short, long = plan.groups
    assert short.rows == [0, 1] and (short.width, short.span) == (4, 16)
    assert long.rows == [2] and long.width == 40 > SHORT_ROW_TOKENS
    assert short.gather[1, :7].tolist() == [8, 9, 10, 11, 36, 37, 38] and not short.gather[1, 7:].any()
    assert short.tokens.tolist() == [0, 1, 2, 3, 4] and short.dest.tolist() == [0, 4, 5, 6, 7]
    # query i of a row sees its positions up to start + i; padding queries see position 0 alone
    assert short.mask[1, 0, 2].tolist() == [j <= 3 + 2 for j in range(16)]
    assert short.mask[0, 0, 0].sum() == 6 and short.mask[0, 0, 1].tolist() == [True] + [False] * 15


def test_a_plan_refuses_a_row_without_room_or_tokens():
    with pytest.raises(ValueError):
        plan_step([RowSpec(3, 2, (0,))], block_tokens=4)
    with pytest.raises(ValueError):
        plan_step([RowSpec(0, 0, (0,))], block_tokens=4)


def test_a_prefill_beside_decode_rows_computes_as_from_scratch(tiny_llm):
    """Two attention groups in one step (decode rows and a prefill longer than SHORT_ROW_TOKENS)."""
    packed = PackedLlamaForward(tiny_llm)
    prompts = [[3, 7, 1, 9, 4], [0, 0, 5], [(i * 5) % 16 for i in range(SHORT_ROW_TOKENS + 9)]]
    states = [packed.new_state() for _ in prompts]
    packed.forward([ForwardRow(states[0], prompts[0][:-1], 1), ForwardRow(states[1], prompts[1][:-1], 1)])
    out = packed.forward([ForwardRow(states[0], prompts[0][-1:] + [2, 2], 3),
                          ForwardRow(states[1], prompts[1][-1:], 1),
                          ForwardRow(states[2], prompts[2], 4)])
    np.testing.assert_allclose(out[0], full_logits(tiny_llm, prompts[0] + [2, 2])[-3:], atol=1e-5)
    np.testing.assert_allclose(out[1], full_logits(tiny_llm, prompts[1])[-1:], atol=1e-5)
    np.testing.assert_allclose(out[2], full_logits(tiny_llm, prompts[2])[-4:], atol=1e-5)


def _step_operators(model, rows: int, draft: int) -> int:
    packed = PackedLlamaForward(model)
    states = [packed.new_state() for _ in range(rows)]
    packed.forward([ForwardRow(s, [1 + i % 7] * (4 + i % 5), 1) for i, s in enumerate(states)])
    with DispatchCount() as count:
        packed.forward([ForwardRow(s, [3] * (draft + 1), draft + 1) for s in states])
    return count.total


def test_a_step_dispatches_as_many_operators_for_any_rows_and_draft_lengths(tiny_llm):
    counts = {(rows, draft): _step_operators(tiny_llm, rows, draft) for rows in (1, 8, 16) for draft in (0, 4, 16)}
    assert len(set(counts.values())) == 1, counts


def test_a_dropped_sequence_returns_its_blocks_and_the_pool_grows_when_short(tiny_llm):
    packed = PackedLlamaForward(tiny_llm)
    free = len(packed.pool.free)
    states = [packed.new_state() for _ in range(free + 3)]
    for s in states:
        s.reserve(BLOCK_TOKENS + 1)  # two blocks each
    assert packed.pool.blocks >= 2 * len(states)
    assert len({b for s in states for b in s.blocks}) == 2 * len(states)
    before = len(packed.pool.free)
    del states[:2], s
    gc.collect()
    assert len(packed.pool.free) == before + 4
