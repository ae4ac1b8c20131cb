"""The index arithmetic of one packed forward step over a paged KV pool (pure numpy, no torch).

A step's rows (a sequence's new tokens: one plain token, a token and its draft, or a prefill) are packed
into T tokens. Their keys and values go to the pool at `writes`; attention runs once per *group* of rows
over a padded batch: each row's queries in `width` slots, its keys gathered from the pool at `gather`
(`span` positions, the row's own blocks, padding pointing at position 0), and `mask` letting query i of a
row see its positions up to start + i. Rows of at most SHORT_ROW_TOKENS tokens (decode and verification
steps) form one group and longer ones (prefills) another, so a long prompt does not pad every decode row
to its length; a step thus has one or two attention calls per layer whatever its rows and drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHORT_ROW_TOKENS = 32
"""Rows up to this many new tokens (a plain token, or one and a draft of up to 31) share the decode group."""
SPAN_ALIGN = 16
"""A group's key span is rounded up to a multiple of this (fewer distinct shapes, little padding)."""


@dataclass(frozen=True)
class RowSpec:
    """One row of a step: the positions it already holds, its new tokens, and its pool blocks (enough for
    start + tokens positions)."""

    start: int
    tokens: int
    blocks: tuple[int, ...]


@dataclass
class AttentionGroup:
    rows: list[int]
    """Indices of the step's rows in this group, in step order."""
    width: int
    """Query slots per row (the group's longest row)."""
    span: int
    """Key positions gathered per row (its longest start + tokens, aligned)."""
    tokens: np.ndarray
    """[T_g] where the group's tokens sit in the packed step."""
    dest: np.ndarray
    """[T_g] each token's slot in the padded queries, row * width + i."""
    gather: np.ndarray
    """[rows, span] pool positions of each row's keys (0 beyond the row's own)."""
    mask: np.ndarray
    """[rows, 1, width, span] bool: query i of a row sees key j iff j <= start + i (padding queries see key 0)."""


@dataclass
class StepPlan:
    positions: np.ndarray
    """[T] each packed token's position in its sequence."""
    writes: np.ndarray
    """[T] each packed token's position in the pool."""
    groups: list[AttentionGroup]


def pool_positions(blocks: tuple[int, ...], positions: np.ndarray, block_tokens: int) -> np.ndarray:
    """Where a sequence's positions lie in the pool: block `blocks[p // B]`, offset p % B."""
    table = np.asarray(blocks, dtype=np.int64)
    return table[positions // block_tokens] * block_tokens + positions % block_tokens


def fill_row_keys(row: RowSpec, gather: np.ndarray, mask: np.ndarray, block_tokens: int) -> None:
    """One row's slot of a padded batch: gather [span] takes the pool positions of the row's keys (the
    rest left as it is), mask [width, span] lets query i see keys up to start + i, and a padding query
    key 0 alone, so that its softmax stays finite."""
    span, width = gather.shape[0], mask.shape[0]
    held = np.arange(row.start + row.tokens)
    gather[: held.size] = pool_positions(row.blocks, held, block_tokens)
    queries = np.arange(width)
    real = queries < row.tokens
    mask[:] = (np.arange(span)[None, :] <= (row.start + queries)[:, None]) & real[:, None]
    mask[~real, 0] = True


def plan_step(rows: list[RowSpec], block_tokens: int, short_tokens: int = SHORT_ROW_TOKENS,
              span_align: int = SPAN_ALIGN) -> StepPlan:
    """The indices of one step (see the module docstring)."""
    if not rows or any(r.tokens < 1 for r in rows):
        raise ValueError("a step needs rows of at least one token each")
    for r in rows:
        if len(r.blocks) * block_tokens < r.start + r.tokens:
            raise ValueError(f"a row of {r.start + r.tokens} positions holds {len(r.blocks)} blocks")
    offsets = np.cumsum([0] + [r.tokens for r in rows])
    positions = np.concatenate([np.arange(r.start, r.start + r.tokens) for r in rows])
    writes = np.concatenate([pool_positions(r.blocks, np.arange(r.start, r.start + r.tokens), block_tokens)
                             for r in rows])
    short = [i for i, r in enumerate(rows) if r.tokens <= short_tokens]
    long = [i for i, r in enumerate(rows) if r.tokens > short_tokens]
    groups = [_group(rows, members, offsets=offsets, block_tokens=block_tokens, span_align=span_align)
              for members in (short, long) if members]
    return StepPlan(positions, writes, groups)


def _group(rows: list[RowSpec], members: list[int], offsets: np.ndarray, block_tokens: int,
           span_align: int) -> AttentionGroup:
    width = max(rows[i].tokens for i in members)
    ends = max(rows[i].start + rows[i].tokens for i in members)
    span = -(-ends // span_align) * span_align
    gather = np.zeros((len(members), span), dtype=np.int64)
    mask = np.zeros((len(members), 1, width, span), dtype=bool)
    tokens, dest = [], []
    for slot, i in enumerate(members):
        r = rows[i]
        fill_row_keys(r, gather[slot], mask[slot, 0], block_tokens)
        tokens.append(np.arange(offsets[i], offsets[i + 1]))
        dest.append(slot * width + np.arange(r.tokens))
    return AttentionGroup(members, width, span=span, tokens=np.concatenate(tokens), dest=np.concatenate(dest),
                          gather=gather, mask=mask)
