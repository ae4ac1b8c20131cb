"""Prompt-lookup (n-gram) drafting: propose what followed the last n tokens the previous time.

Costs microseconds and needs no model; it pays off on text that repeats the prompt (summaries,
code edits, quoting) and proposes nothing elsewhere. `NgramEngine` serves it as an engine, so the
orchestrator calls it like any other SSM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.engines.draft_confidence import DraftConfidence, Evidence, confident_prefix
from minions.engines.lookup_engine import LookupEngine


MAX_MATCH = 64
"""How far back a found match is followed to measure it (bounds the draft at spec_factor * MAX_MATCH)."""


def spec_limit(k: int, match: int, spec_factor: float) -> int:
    """How many tokens a lookup drafter may draft after a match of `match` tokens: at most k, and at
    most spec_factor * match when spec_factor > 0 (SuffixDecoding's max_spec_factor; 0: no bound)."""
    return min(k, math.ceil(spec_factor * match)) if spec_factor > 0 else k


def ngram_draft(tokens: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1,
                spec_factor: float = 0.0) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix.

    Tries suffix lengths max_ngram down to min_ngram; returns [] when nothing matches. With
    `spec_factor` > 0 the draft is at most spec_factor times the match's whole length (followed back
    beyond the n-gram, up to MAX_MATCH), as SuffixDecoding bounds its drafts: a 2-token match, which
    any text has, is weak evidence for a long continuation; a copy that has run for 30 tokens is strong.
    """
    return ngram_match(tokens, k, max_ngram=max_ngram, min_ngram=min_ngram, spec_factor=spec_factor)[0]


def ngram_match(tokens: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1,
                spec_factor: float = 0.0) -> tuple[list[int], int]:
    """`ngram_draft`'s draft, and the length of the match it continues (0 with no draft)."""
    if k <= 0 or len(tokens) < 2:
        return [], 0
    seq = np.asarray(tokens, dtype=np.int64)
    n_total = len(seq)
    for n in range(min(max_ngram, n_total - 1), min_ngram - 1, -1):
        suffix = seq[n_total - n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[: n_total - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        starts = starts[starts + n < n_total]  # a continuation must exist before the suffix itself
        if starts.size:
            start = int(starts[-1])
            begin = start + n
            match = _match_length(seq, start, n)
            if spec_factor > 0:
                k = spec_limit(k, match, spec_factor)
            return [int(t) for t in seq[begin: min(begin + k, n_total)]], match
    return [], 0


def _match_length(seq: np.ndarray, start: int, n: int) -> int:
    """How many tokens before the sequence's end match those before `start + n` (at least n)."""
    length = n
    while length < MAX_MATCH and start + n - length - 1 >= 0 and seq[start + n - length - 1] == seq[-length - 1]:
        length += 1
    return length


class NgramEngine(LookupEngine):
    """An `Engine` (engines/api.py): each call looks the draft up in its input_ids. The only state is
    what earlier drafts turned out to be worth (draft_confidence.py): a draft ends where its estimated
    chance of being right so far falls below `min_confidence`."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, spec_factor: float = 0.0,
                 min_confidence: float = 0.0, settle_margin: int = 16) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.spec_factor = spec_factor
        self.min_confidence = min_confidence
        self.confidence = DraftConfidence(settle_margin)

    def _lookup(self, request: EngineRequest) -> tuple[list[int], list[float]]:
        sequence = request.input_ids
        tokens, match = ngram_match(sequence, request.request_output_len, max_ngram=self.max_ngram,
                                    min_ngram=self.min_ngram, spec_factor=self.spec_factor)
        survival: list[float] = []
        if tokens:
            evidence = Evidence("own", match)
            self.confidence.record(request.request_id, sequence, tokens, evidence)
            if self.min_confidence > 0 or request.return_log_probs:  # else nothing to estimate on this hot path
                survival = self.confidence.survival(evidence, len(tokens))
                tokens = tokens[: confident_prefix(survival, self.min_confidence)]
        return tokens, survival
