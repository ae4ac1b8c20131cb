"""The prefix cache's bookkeeping (engines/prefix_cache.py): which slot a new sequence gets, what it
shares, what is evicted. The llama.cpp engine's use of it is checked in test_llamacpp_prefix_cache.py."""

from __future__ import annotations

import pytest

from minions.engines.prefix_cache import PrefixCache, SlotChoice

CONVERSATION = list(range(100, 140))


def placed(cache: PrefixCache, request_id: str, tokens: list[int], busy=(), share: bool = True) -> SlotChoice:
    entry, choice = cache.place(request_id, tokens, busy=set(busy), share=share)
    assert entry.state == choice.slot and entry.tokens == tokens[: choice.shared]
    return choice


def finished(cache: PrefixCache, request_id: str, tokens: list[int]) -> None:
    """The request evaluated `tokens` (as the engine records them), then ended."""
    cache.live.get(request_id).tokens = list(tokens)
    cache.finish(request_id)


def test_a_repeated_prompt_shares_all_but_its_last_token_and_the_stats_count_it():
    cache = PrefixCache(4)
    first = placed(cache, "a", CONVERSATION)
    assert first.donor is None and first.shared == 0
    finished(cache, "a", CONVERSATION + [7, 8])
    again = placed(cache, "b", CONVERSATION)
    assert again.donor == first.slot and again.shared == len(CONVERSATION) - 1
    assert again.slot != first.slot, "a free slot is used: the idle prefix stays for later requests"
    assert cache.stats.queries == 2 * len(CONVERSATION) and cache.stats.hits == len(CONVERSATION) - 1


def test_a_partial_match_shares_the_common_prefix_only():
    cache = PrefixCache(4)
    placed(cache, "a", CONVERSATION)
    finished(cache, "a", CONVERSATION)
    other = CONVERSATION[:25] + [9, 9, 9]
    assert placed(cache, "b", other).shared == 25


def test_an_extended_conversation_shares_the_whole_earlier_turn():
    cache = PrefixCache(4)
    placed(cache, "turn1", CONVERSATION)
    answer = [5, 6, 7]
    finished(cache, "turn1", CONVERSATION + answer)
    turn2 = CONVERSATION + answer + [11, 12, 13]
    assert placed(cache, "turn2", turn2).shared == len(CONVERSATION) + len(answer)


def test_the_longest_of_several_prefixes_wins_live_or_idle():
    cache = PrefixCache(4)
    placed(cache, "short", CONVERSATION[:10])
    finished(cache, "short", CONVERSATION[:10])
    live = placed(cache, "long", CONVERSATION)
    cache.live.get("long").tokens = CONVERSATION[:30]  # evaluated so far; its call goes on
    choice = placed(cache, "new", CONVERSATION + [1])
    assert choice.donor == live.slot and choice.shared == 30


def test_a_full_cache_evicts_the_oldest_idle_prefix_not_a_donor_barely_shared_and_never_a_busy_sequence():
    cache = PrefixCache(3)
    for name, base in (("old", 1000), ("donor", 2000), ("live", 3000)):
        placed(cache, name, [base + i for i in range(8)])
        cache.live.get(name).tokens = [base + i for i in range(8)]
    cache.finish("old")
    cache.finish("donor")
    choice = placed(cache, "new", [2000 + i for i in range(3)] + [1], busy={"live"})
    assert choice.evicted is not None and choice.donor is not None and choice.evicted != choice.donor
    assert choice.shared == 3
    assert list(cache.idle) == [choice.donor], "the oldest idle prefix made room, the donor stays"
    assert len(cache) == 3, "never more sequences than slots: the KV budget holds"


def test_a_conversation_s_next_turn_takes_over_its_own_idle_prefix_and_evicts_no_other():
    cache = PrefixCache(2)
    for name, base in (("other", 1000), ("turn1", 2000)):
        placed(cache, name, [base + i for i in range(8)])
        finished(cache, name, [base + i for i in range(10)])
    turn2 = [2000 + i for i in range(10)] + [7, 7]
    choice = placed(cache, "turn2", turn2)
    assert choice.slot == choice.donor and choice.evicted is None and choice.shared == 10
    assert len(cache.idle) == 1, "the other conversation's prefix stays"


def test_a_live_donor_whose_end_has_not_arrived_is_taken_over_when_all_others_are_busy():
    cache = PrefixCache(2)
    placed(cache, "busy", [1, 2, 3])
    placed(cache, "turn1", CONVERSATION)
    cache.live.get("turn1").tokens = CONVERSATION  # answered; its release is still on its way
    choice = placed(cache, "turn2", CONVERSATION + [5], busy={"busy"})
    assert choice.slot == choice.donor and choice.shared == len(CONVERSATION) and choice.evicted is None
    assert "turn1" not in cache.live and "busy" in cache.live


def test_the_idle_donor_is_taken_over_when_it_is_the_only_room():
    cache = PrefixCache(2)
    placed(cache, "busy", [1, 2, 3])
    placed(cache, "a", CONVERSATION)
    finished(cache, "a", CONVERSATION)
    choice = placed(cache, "b", CONVERSATION[:20] + [0], busy={"busy"})
    assert choice.slot == choice.donor and choice.evicted is None and choice.shared == 20
    assert not cache.idle


def test_a_live_sequence_is_evicted_only_when_idle_ones_are_gone_and_never_while_busy():
    cache = PrefixCache(2)
    placed(cache, "resting", [1, 2, 3])  # live, no call in progress
    placed(cache, "busy", [4, 5, 6])
    choice = placed(cache, "new", [7, 8], busy={"busy"})
    assert choice.evicted is not None and "resting" not in cache.live and "busy" in cache.live
    with pytest.raises(RuntimeError, match="call in progress"):
        cache.place("more", [9], busy={"busy", "new"})


def test_a_dropped_sequence_is_not_kept_as_a_prefix():
    cache = PrefixCache(2)
    choice = placed(cache, "failed", CONVERSATION)
    cache.live.get("failed").tokens = CONVERSATION
    assert cache.drop("failed") == choice.slot
    assert not cache.idle and placed(cache, "again", CONVERSATION).shared == 0


def test_an_empty_finished_sequence_frees_its_slot():
    cache = PrefixCache(1)
    placed(cache, "nothing", [1])
    cache.finish("nothing")
    assert not cache.idle and placed(cache, "next", [2]).evicted is None


def test_a_sequence_that_does_not_share_uses_no_prefix_lends_none_and_leaves_none():
    cache = PrefixCache(3)
    placed(cache, "a", CONVERSATION)
    finished(cache, "a", CONVERSATION)
    queries = cache.stats.queries
    seeded = placed(cache, "seeded", CONVERSATION, share=False)
    assert seeded.donor is None and seeded.shared == 0 and cache.stats.queries == queries
    cache.live.get("seeded").tokens = CONVERSATION
    assert placed(cache, "other", CONVERSATION).donor != seeded.slot, "it lends its cells to no other"
    cache.finish("seeded")
    assert seeded.slot in cache.free and seeded.slot not in cache.idle


def stored_cache(limit: int) -> PrefixCache:
    return PrefixCache(4, stored_bytes=limit)


def finish_and_store(cache: PrefixCache, request_id: str, tokens: list[int], size: int) -> int | None:
    cache.live.get(request_id).tokens = list(tokens)
    slot, stored = cache.finish(request_id)
    assert stored == tokens
    cache.store(stored, f"blob of {request_id}", size)
    return slot


def test_with_a_host_memory_tier_a_finished_slot_is_freed_and_its_prefix_restored_from_the_store():
    cache = stored_cache(1000)
    first = placed(cache, "a", CONVERSATION)
    assert finish_and_store(cache, "a", CONVERSATION + [7], 100) == first.slot
    assert not cache.idle and len(cache.free) == 4
    again = placed(cache, "b", CONVERSATION + [7, 8])
    assert again.restore == "blob of a" and again.donor is None and again.shared == len(CONVERSATION) + 1
    assert cache.stats.hits == len(CONVERSATION) + 1


def test_a_longer_live_prefix_is_shared_rather_than_a_stored_one():
    cache = stored_cache(1000)
    placed(cache, "a", CONVERSATION[:10])
    finish_and_store(cache, "a", CONVERSATION[:10], 100)
    live = placed(cache, "live", CONVERSATION)
    cache.live.get("live").tokens = CONVERSATION[:30]
    choice = placed(cache, "new", CONVERSATION + [1])
    assert choice.restore is None and choice.donor == live.slot and choice.shared == 30


def test_the_store_keeps_its_bytes_least_recently_used_first_and_drops_what_a_newer_turn_extends():
    cache = stored_cache(250)
    for name, base in (("x", 1000), ("y", 2000)):
        placed(cache, name, [base + i for i in range(8)])
        finish_and_store(cache, name, [base + i for i in range(8)], 100)
    assert placed(cache, "x again", [1000 + i for i in range(8)] + [5]).restore == "blob of x"  # x is now the newest
    finish_and_store(cache, "x again", [1000 + i for i in range(8)] + [5, 6], 100)  # extends x: x goes
    assert [s.blob for s in cache.stored] == ["blob of y", "blob of x again"]
    placed(cache, "z", [3000 + i for i in range(8)])
    finish_and_store(cache, "z", [3000 + i for i in range(8)], 100)  # 300 bytes > 250: y, the oldest, goes
    assert [s.blob for s in cache.stored] == ["blob of x again", "blob of z"]
    assert cache.stored.size() == 200


def test_a_sequence_larger_than_the_store_is_not_kept():
    cache = stored_cache(50)
    placed(cache, "a", CONVERSATION)
    finish_and_store(cache, "a", CONVERSATION, 100)
    assert not cache.stored


def test_a_live_sequence_moves_into_the_lowest_free_slot_below_it():
    cache = PrefixCache(4, stored_bytes=1 << 20)
    entries = {name: cache.place(name, [i, 1, 2], busy=set())[0] for i, name in enumerate("abcd")}
    assert cache.gap_below(3) is None
    cache.finish("b")
    cache.finish("a")
    assert cache.gap_below(3) == 0 and cache.gap_below(0) is None
    assert cache.move(entries["d"], 0) == 3
    assert entries["d"].state == 0 and cache.live.get("d") is entries["d"]
    assert sorted(cache.free) == [1, 3] and cache.gap_below(2) == 1
