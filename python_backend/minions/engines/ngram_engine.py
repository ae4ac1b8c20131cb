"""Prompt-lookup (n-gram) drafting: propose what followed the last n tokens the previous time.

Costs microseconds and needs no model; it pays off on text that repeats the prompt (summaries,
code edits, quoting) and proposes nothing elsewhere. `NgramEngine` serves it as an engine, so the
orchestrator calls it like any other SSM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.errors import InvalidRequest


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


class NgramEngine:
    """An `Engine` (engines/api.py) without state: each call looks the draft up in its input_ids."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def generate(self, request: EngineRequest) -> EngineResult:
        if request.stop:
            return EngineResult([])
        if request.draft:
            raise InvalidRequest("this engine drafts only: draft_input_ids are not supported")
        # return_generation_logits: a lookup has no logits, so none are returned (the draft is then
        # treated as deterministic, which is exactly what it is).
        tokens = ngram_draft(request.input_ids, request.request_output_len, self.max_ngram, self.min_ngram)
        if request.end_id is not None and request.end_id in tokens:
            tokens = tokens[: tokens.index(request.end_id) + 1]
        return EngineResult(tokens)

    def release(self, request_id: str) -> None:
        """Stateless: nothing to free."""
