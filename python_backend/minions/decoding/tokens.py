"""Token-sequence rules every layer shares."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    mismatch = np.flatnonzero(x != y)
    return int(mismatch[0]) if mismatch.size else n


def longest_shared(candidates: Iterable[tuple[T, Sequence[int]]], tokens: Sequence[int]) -> tuple[T | None, int]:
    """Of (item, its tokens) pairs, the item whose tokens share the most leading tokens with `tokens`, and
    how many (the first such item on a tie; None, 0 when none shares any)."""
    best, length = None, 0
    for item, theirs in candidates:
        if (n := common_prefix_len(theirs, tokens)) > length:
            best, length = item, n
    return best, length


def draft_outcome(seen: Sequence[int], draft: Sequence[int]) -> int | None:
    """How many of a draft's tokens were right, judged by `seen`, the tokens that followed where the
    draft started (as verification would have: up to the first wrong one); None while `seen` agrees
    with the draft and is shorter than it (the outcome is not known yet)."""
    seen = seen[: len(draft)]
    right = common_prefix_len(seen, draft)
    return right if right < len(seen) or len(seen) == len(draft) else None
