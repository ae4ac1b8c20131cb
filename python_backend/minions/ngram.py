"""Prompt-lookup (n-gram) drafting: propose what followed the last n tokens the previous time.

Costs microseconds and needs no model; it pays off on text that repeats the prompt (summaries,
code edits, quoting) and proposes nothing elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ngram_draft(tokens: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix.

    Tries suffix lengths max_ngram down to min_ngram; returns [] when nothing matches.
    """
    if k <= 0 or len(tokens) < 2:
        return []
    seq = np.asarray(tokens, dtype=np.int64)
    n_total = len(seq)
    for n in range(min(max_ngram, n_total - 1), min_ngram - 1, -1):
        suffix = seq[n_total - n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[: n_total - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        starts = starts[starts + n < n_total]  # a continuation must exist before the suffix itself
        if starts.size:
            begin = int(starts[-1]) + n
            return [int(t) for t in seq[begin: min(begin + k, n_total)]]
    return []
