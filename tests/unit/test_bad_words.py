"""minions.text.bad_words: TensorRT-LLM bad-word semantics and its [2, N] tensor layout."""

from __future__ import annotations

import numpy as np
import pytest

from minions.text.bad_words import BadWords


def test_single_token_words_are_banned_everywhere():
    bad = BadWords([[7], [3]])
    assert sorted(bad.banned_next([])) == [3, 7]
    assert sorted(bad.banned_next([1, 2, 3])) == [3, 7]


def test_multi_token_word_bans_last_token_only_after_its_head():
    bad = BadWords([[4, 5, 6]])
    assert bad.banned_next([1, 4, 5]) == [6]
    assert bad.banned_next([4, 5, 1]) == []
    assert bad.banned_next([5]) == [], "a context shorter than the head cannot complete the word"
    assert bad.banned_next([4, 4, 5]) == [6]
    assert bad.banned_next([]) == []


def test_several_words_combine():
    bad = BadWords([[9], [1, 2], [3, 1, 2], [8, 2]])
    assert set(bad.banned_next([3, 1])) == {2, 9}
    assert set(bad.banned_next([0, 8])) == {2, 9}
    assert bad.banned_next([0]) == [9]


def test_empty_words_are_dropped_and_falsy():
    assert not BadWords([])
    assert not BadWords([[], []])
    assert BadWords([[], [1]]).words == [[1]]
    assert BadWords([]).banned_next([1, 2]) == []


def test_to_tensor_layout():
    """Row 0: flattened ids; row 1: cumulative end offsets padded with -1 (TensorRT-LLM's layout)."""
    t = BadWords([[1, 2], [3], [4, 5, 6]]).to_tensor()
    assert t.dtype == np.int32 and t.shape == (2, 6)
    np.testing.assert_array_equal(t[0], [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(t[1], [2, 3, 6, -1, -1, -1])


@pytest.mark.parametrize("words", [[[1, 2], [3], [4, 5, 6]], [[0]], [[10, 11, 12, 13]], []])
def test_tensor_round_trip(words):
    bad = BadWords(words)
    back = BadWords.from_tensor(bad.to_tensor())
    assert back.words == bad.words


def test_from_tensor_accepts_none_empty_and_flat_shapes():
    assert BadWords.from_tensor(None).words == []
    assert BadWords.from_tensor(np.zeros((2, 0), dtype=np.int32)).words == []
    flat = BadWords([[5, 6], [7]]).to_tensor().reshape(-1)  # [2 * N] as some clients send it
    assert BadWords.from_tensor(flat).words == [[5, 6], [7]]


def test_from_tensor_with_wider_padding():
    """Batched tensors are padded to the widest row: ids with 0, offsets with -1."""
    t = np.array([[5, 6, 7, 0, 0], [2, 3, -1, -1, -1]], dtype=np.int32)
    assert BadWords.from_tensor(t).words == [[5, 6], [7]]
