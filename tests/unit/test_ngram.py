"""minions.engines.ngram_engine.ngram_draft: prompt-lookup drafting."""

from __future__ import annotations

import pytest

from minions.engines.ngram_engine import ngram_draft


def test_copies_what_followed_the_previous_occurrence():
    tokens = [1, 2, 3, 4, 5, 9, 2, 3]
    assert ngram_draft(tokens, 2) == [4, 5]


def test_uses_most_recent_occurrence():
    tokens = [7, 8, 1, 7, 8, 2, 0, 7, 8]
    assert ngram_draft(tokens, 1, max_ngram=2) == [2]


def test_longest_ngram_wins_over_more_recent_shorter_match():
    """Suffix [1, 2, 3]: a 3-gram match early in the sequence beats a later 1-gram match of 3."""
    tokens = [1, 2, 3, 10, 11, 3, 20, 0, 1, 2, 3]
    assert ngram_draft(tokens, 2, max_ngram=3) == [10, 11]
    assert ngram_draft(tokens, 2, max_ngram=1) == [20, 0], "with unigrams only, the last 3 (index 5) is used"


def test_no_match_returns_empty():
    assert ngram_draft([1, 2, 3, 4], 3) == []


def test_respects_min_ngram():
    tokens = [5, 1, 6, 2, 1]
    assert ngram_draft(tokens, 2, max_ngram=3, min_ngram=1) == [6, 2]
    assert ngram_draft(tokens, 2, max_ngram=3, min_ngram=2) == []


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_never_more_than_k(k):
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    out = ngram_draft(tokens, k)
    assert out == [3, 4, 5, 6, 7, 8, 1, 2][:k]


def test_continuation_stops_at_end_of_sequence():
    """The draft is the text after the match, so it can be shorter than k but never empty on a match."""
    tokens = [4, 4]
    assert ngram_draft(tokens, 5) == [4]
    tokens = [1, 2, 1, 2]
    assert ngram_draft(tokens, 5, max_ngram=2) == [1, 2]


def test_suffix_never_matches_itself():
    """The last tokens must not be found at their own position (that has no continuation)."""
    assert ngram_draft([9, 8, 7], 3) == []
    assert ngram_draft([3], 3) == []
    assert ngram_draft([], 3) == []


def test_k_zero_or_negative():
    assert ngram_draft([1, 2, 1], 0) == []
    assert ngram_draft([1, 2, 1], -1) == []


def test_max_ngram_longer_than_sequence():
    assert ngram_draft([6, 6, 6], 2, max_ngram=10) == [6]


def test_a_spec_factor_bounds_the_draft_by_the_whole_match_followed_back():
    weak = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]  # [1, 2, 3] matched; the token before differs: a 3-token match
    assert ngram_draft(weak, 10, 3, 2) == [4, 5, 6, 7, 8, 1, 2, 3]
    assert ngram_draft(weak, 10, 3, 2, spec_factor=2.0) == [4, 5, 6, 7, 8, 1]
    longer = [5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 1, 2, 3]  # [5, 1, 2, 3]: the match is 4 long
    assert ngram_draft(longer, 16, 3, 2, spec_factor=1.0) == [4, 5, 6, 7]
    assert ngram_draft(longer, 16, 3, 2, spec_factor=2.0) == [4, 5, 6, 7, 8, 9, 10, 11]
