"""minions.text.stop_strings: stop strings in streamed text are never emitted, even split across chunks."""

from __future__ import annotations

import pytest

from minions.text.stop_strings import StopStringMatcher


def run(stops, chunks):
    """Feed all chunks (then flush); return the emitted pieces and whether it stopped."""
    m = StopStringMatcher(stops)
    pieces = [m.feed(c) for c in chunks]
    pieces.append(m.flush())
    return pieces, m.stopped


def test_no_stop_strings_passes_text_through():
    m = StopStringMatcher(["", ""])
    assert m.feed("abc") == "abc" and m.flush() == "" and not m.stopped


def test_stop_inside_one_chunk_cuts_before_it():
    pieces, stopped = run(["END"], ["hello END world"])
    assert "".join(pieces) == "hello " and stopped


def test_stop_split_across_feeds_is_never_emitted():
    pieces, stopped = run(["</stop>"], ["Answer: 42<", "/st", "op> trailing", "more"])
    assert stopped
    assert "".join(pieces) == "Answer: 42"
    assert all("<" not in p for p in pieces), pieces


@pytest.mark.parametrize("cut", range(1, 12))
def test_every_split_point(cut):
    """Whatever the chunking, the output is the text before the stop string."""
    text = "ab STOP cd"
    pieces, stopped = run(["STOP"], [text[:cut], text[cut:]])
    assert "".join(pieces) == "ab " and stopped


def test_partial_prefix_is_held_back_then_released_by_flush():
    m = StopStringMatcher(["###"])
    assert m.feed("total: 5 #") == "total: 5 "
    assert m.feed("#") == ""
    assert m.flush() == "##", "generation ended: the held-back text was not a stop string"
    assert not m.stopped


def test_partial_prefix_released_when_disproved():
    m = StopStringMatcher(["###"])
    assert m.feed("a ##") == "a "
    assert m.feed("x") == "##x"


def test_earliest_of_several_stops_wins():
    pieces, stopped = run(["world", "lo"], ["hello world"])
    assert "".join(pieces) == "hel" and stopped


def test_earliest_stop_wins_across_chunks():
    pieces, _ = run(["BBB", "A"], ["xBB", "B A"])
    assert "".join(pieces) == "x"


def test_longest_partial_is_held_for_overlapping_stops():
    """'ab' could start 'abc' (held), and 'b' alone could start 'bd'; hold the longer, 'ab'."""
    m = StopStringMatcher(["abc", "bd"])
    assert m.feed("xab") == "x"
    assert m.feed("d") == "a", "'abd' contains 'bd': emit up to it"
    assert m.stopped


def test_nothing_after_stop():
    m = StopStringMatcher(["."])
    assert m.feed("one. two") == "one"
    assert m.feed("three") == "" and m.flush() == ""
