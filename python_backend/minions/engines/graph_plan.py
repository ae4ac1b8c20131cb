"""The shapes CUDA graphs are captured for, and a step's inputs laid out in one (pure numpy, no torch).

A captured graph replays fixed shapes, so a step is padded to a *bucket*: `rows` sequences (fewer get
padding rows), `width` tokens each (a plain token, or one and a draft; a shorter row's padding tokens
are computed and thrown away), keys gathered over `span` positions. A step with a longer row (a prefill)
or beyond the largest bucket runs eagerly. Padding writes its keys and values to the pool's scratch
block, which no sequence owns and no real query sees; padding queries see position 0 alone, so every
softmax stays finite. Which buckets are captured is chosen within a memory budget, plain decoding's
first (`captured_buckets`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minions.engines.step_plan import SHORT_ROW_TOKENS, RowSpec, fill_row_keys, pool_positions

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
WIDTH_BUCKETS = (1, 2, 4, 8, 16, SHORT_ROW_TOKENS)
"""Tokens a row: 1 is plain decoding; up to SHORT_ROW_TOKENS, one token and a draft."""
SPAN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True, order=True)
class Bucket:
    rows: int
    width: int
    span: int

    @property
    def tokens(self) -> int:
        return self.rows * self.width


def _at_least(value: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= value), None)


def bucket_for(rows: list[RowSpec], limits: Bucket) -> Bucket | None:
    """The smallest bucket within `limits` that holds the step; None: run it eagerly."""
    shape = (_at_least(len(rows), ROW_BUCKETS), _at_least(max(r.tokens for r in rows), WIDTH_BUCKETS),
             _at_least(max(r.start + r.tokens for r in rows), SPAN_BUCKETS))
    if None in shape:
        return None
    bucket = Bucket(*shape)  # type: ignore[arg-type]
    fits = bucket.rows <= limits.rows and bucket.width <= limits.width and bucket.span <= limits.span
    return bucket if fits else None


def captured_buckets(limits: Bucket, budget_bytes: int, bytes_of) -> list[Bucket]:
    """The buckets to capture within `limits`, plain decoding first (width 1, every row count, shorter
    spans first), then drafts by width; each costs `bytes_of(bucket)` until the budget is spent."""
    candidates = [Bucket(r, w, s) for w in WIDTH_BUCKETS for s in SPAN_BUCKETS for r in ROW_BUCKETS
                  if r <= limits.rows and w <= limits.width and s <= limits.span]
    chosen, spent = [], 0
    for bucket in candidates:
        cost = bytes_of(bucket)
        if spent + cost <= budget_bytes:
            chosen.append(bucket)
            spent += cost
    return chosen


@dataclass
class DenseStep:
    """A step laid out in a bucket: what the graph's static input tensors are filled with."""

    bucket: Bucket
    ids: np.ndarray
    """[rows * width] token ids (0 for padding)."""
    positions: np.ndarray
    """[rows * width] positions in their sequences (0 for padding)."""
    writes: np.ndarray
    """[rows * width] pool positions each token's keys and values go to (the scratch block for padding)."""
    gather: np.ndarray
    """[rows, span] pool positions of each row's keys (the scratch block beyond a row's own)."""
    mask: np.ndarray
    """[rows, 1, width, span] bool: query i of a row sees key j iff j <= start + i; padding sees key 0."""
    logit_rows: list[np.ndarray]
    """Per real row, the indices of its logits in the [rows * width] output."""


def dense_step(rows: list[RowSpec], tokens: list[list[int]], n_logits: list[int], bucket: Bucket,
               block_tokens: int, scratch_block: int) -> DenseStep:
    """Lay out a step's rows (their specs, new tokens and wanted logits) in `bucket`."""
    width, span = bucket.width, bucket.span
    scratch = scratch_block * block_tokens + np.arange(bucket.tokens) % block_tokens
    ids = np.zeros(bucket.tokens, dtype=np.int64)
    positions = np.zeros(bucket.tokens, dtype=np.int64)
    writes = scratch.copy()
    gather = np.full((bucket.rows, span), scratch_block * block_tokens, dtype=np.int64)
    mask = np.zeros((bucket.rows, 1, width, span), dtype=bool)
    mask[:, 0, :, 0] = True  # padding rows' queries see key 0 alone
    logit_rows = []
    for slot, (row, new, keep) in enumerate(zip(rows, tokens, n_logits)):
        at = slot * width + np.arange(row.tokens)
        ids[at] = new
        positions[at] = np.arange(row.start, row.start + row.tokens)
        writes[at] = pool_positions(row.blocks, positions[at], block_tokens)
        fill_row_keys(row, gather[slot], mask[slot, 0], block_tokens)
        logit_rows.append(at[row.tokens - keep:])
    return DenseStep(bucket, ids, positions=positions, writes=writes, gather=gather, mask=mask, logit_rows=logit_rows)
