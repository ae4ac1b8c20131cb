"""minions.engines.sequence_cache: prefix matching and the LRU table engines keep per request."""

from __future__ import annotations

import pytest

from minions.decoding.tokens import common_prefix_len
from minions.engines.sequence_cache import CachedSequence, SequenceCache


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ([], [], 0),
        ([1, 2], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3, 4], 2),
        ([1, 2, 3], [1, 5, 3], 1),
        ([9, 2, 3], [1, 2, 3], 0),
    ],
)
def test_common_prefix_len(a, b, n):
    assert common_prefix_len(a, b) == n
    assert common_prefix_len(b, a) == n


def entry(name: str) -> CachedSequence:
    return CachedSequence(state=name, tokens=[1, 2, 3])


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        SequenceCache(0)


def test_lru_evicts_least_recently_inserted_first():
    cache = SequenceCache(2)
    assert cache.put("a", entry("A")) == []
    assert cache.put("b", entry("B")) == []
    evicted = cache.put("c", entry("C"))
    assert [e.state for e in evicted] == ["A"]
    assert "a" not in cache and "b" in cache and "c" in cache
    assert len(cache) == 2 and cache.evictions == 1


def test_get_refreshes_recency():
    cache = SequenceCache(2)
    cache.put("a", entry("A"))
    cache.put("b", entry("B"))
    assert cache.get("a").state == "A"
    evicted = cache.put("c", entry("C"))
    assert [e.state for e in evicted] == ["B"], "a was used more recently than b"
    assert "a" in cache


def test_get_missing_returns_none():
    assert SequenceCache(1).get("nope") is None


def test_put_replaces_existing_without_eviction():
    cache = SequenceCache(2)
    cache.put("a", entry("A"))
    cache.put("b", entry("B"))
    assert cache.put("a", entry("A2")) == []
    assert cache.get("a").state == "A2" and len(cache) == 2
    assert [e.state for e in cache.put("c", entry("C"))] == ["B"]


def test_release_frees_the_entry():
    cache = SequenceCache(2)
    cache.put("a", entry("A"))
    assert cache.release("a").state == "A"
    assert "a" not in cache and len(cache) == 0
    assert cache.release("a") is None, "releasing twice is harmless"


def test_pop_oldest_and_cached_tokens():
    cache = SequenceCache(3)
    assert cache.pop_oldest() is None
    cache.put("a", CachedSequence("A", [1]))
    cache.put("b", CachedSequence("B", [1, 2]))
    assert cache.cached_tokens() == 3
    assert cache.pop_oldest().state == "A"
    assert cache.evictions == 1 and cache.cached_tokens() == 2


def test_pop_oldest_skips_entries_in_use():
    cache = SequenceCache(3)
    for name in "abc":
        cache.put(name, CachedSequence(name.upper(), [1]))
    assert cache.pop_oldest(keep={"a", "b"}).state == "C"
    assert cache.pop_oldest(keep={"a", "b"}) is None
    assert cache.evictions == 1 and "a" in cache and "b" in cache
