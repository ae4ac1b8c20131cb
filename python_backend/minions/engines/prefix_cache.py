"""Automatic prefix caching for an engine whose sequences live in a fixed set of slots (llama.cpp's
sequence ids in one unified KV buffer).

A finished sequence's slot is not cleared: it stays as an idle prefix, least recently used first. A
new request starts from the longest common prefix of its tokens with any slot's, finished or live
(token-exact, as llama-server picks a slot by longest common prefix), shares those KV cells and
computes only the rest. Which slot it gets, in this order: a free one; its idle donor when at least
half of what the donor holds is shared (a conversation's next turn: taken over, its tail dropped);
the least recently used idle prefix that is not its donor; its idle donor; the least recently used
live sequence with no call in progress that is not its donor; its live donor when that is the only
one resting (a request whose end has not arrived yet). A sequence with a call in progress is never
evicted. The KV budget holds: every slot, idle or live, is held to one sequence's context, and there
are no more slots than the engine was given.
With a host-memory tier (`stored_bytes` > 0, llama-server's `--cache-ram`), a finished sequence is
not left idle in the KV buffer: llama.cpp's attention visits every cell up to the highest one in use,
so idle prefixes would slow every step of the live ones (docs/engines.md measures by how much). Its
cells are copied to host memory (the engine's opaque blob) and cleared, and its slot is free. A new
request then also looks there: when a stored prefix is the longest, the engine copies it into the new
slot (far cheaper than computing it again) and drops what lies beyond the common prefix. Stored prefixes are kept
least recently used first within `stored_bytes`; one that a newer stored sequence extends (a
conversation's earlier turn) is dropped.

Disabled, a finished sequence's slot is cleared and nothing is shared (every request is computed
from scratch). A sequence placed with `share` false (a seeded sampled request: a cached prefix would
round its logits otherwise than a recomputed one, and a repeated seed must repeat its draws) is
computed from scratch, lends its cells to no other, and is cleared when it finishes.

With a KV stream per slot a live sequence may also move down into a free slot (`gap_below`, `move`),
so that the slots a step uses stay consecutive.

This module is the bookkeeping alone; the engine moves the cells (engines/llamacpp_engine.py).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass

from minions.decoding.tokens import longest_shared
from minions.engines.sequence_cache import CachedSequence, SequenceCache
from minions.engines.stored_prefixes import StoredPrefixes


@dataclass
class PrefixCacheStats:
    """vLLM's prefix-cache counters, in tokens: prompt tokens of new sequences looked up, and those of
    them found cached (hit rate = hits / queries)."""

    queries: int = 0
    hits: int = 0


@dataclass
class SlotChoice:
    """Where a new sequence goes: its slot, the slot it shares its first `shared` tokens with (None when
    nothing is shared; the slot itself when the donor is taken over), and the slot to clear first (an
    evicted sequence's; None when the slot was free or is taken over). `restore`: the host-memory blob
    to copy into the slot first (its first `shared` tokens are kept), when a stored prefix was longest."""

    slot: int
    donor: int | None
    shared: int
    evicted: int | None
    restore: object | None = None


class PrefixCache:
    """Slot bookkeeping: live sequences by request id, idle prefixes by age, free slots."""

    def __init__(self, num_slots: int, enabled: bool = True, stored_bytes: int = 0) -> None:
        self.enabled = enabled
        self.stored = StoredPrefixes(stored_bytes if enabled else 0)
        """Host-memory prefixes (blobs: the engine's copies of their cells)."""
        self.live: SequenceCache[int] = SequenceCache(num_slots)
        self.idle: OrderedDict[int, CachedSequence[int]] = OrderedDict()  # slot -> entry, oldest first
        self.free = list(range(num_slots))
        self.private: set[int] = set()
        """Slots of live sequences placed with `share` false."""
        self.stats = PrefixCacheStats()

    @property
    def stored_bytes(self) -> int:
        """The host-memory tier's bound (0: none; finished sequences stay idle in their slots)."""
        return self.stored.capacity_bytes

    def __len__(self) -> int:
        """Sequences held, live or idle."""
        return len(self.live) + len(self.idle)

    def place(self, request_id: str, tokens: list[int], busy: Container[str], share: bool = True
              ) -> tuple[CachedSequence[int], SlotChoice]:
        """The live entry of a new request id (its `tokens` already those of the shared prefix) and how
        its slot was found. `busy`: ids with a call in progress, never evicted. At most len(tokens) - 1
        tokens are shared: the last one is evaluated for its logits. Raises RuntimeError when every slot
        holds a sequence with a call in progress."""
        share = share and self.enabled
        donor, shared = self._best_donor(tokens) if share else (None, 0)
        stored, from_store = self.stored.longest(tokens) if share else (None, 0)
        if from_store > shared:
            donor, shared = None, from_store
        else:
            stored = None
        shared = min(shared, max(len(tokens) - 1, 0))
        if shared == 0:
            donor = stored = None
        slot, evicted = self._free_slot(donor, shared, busy)
        if share:
            self.stats.queries += len(tokens)
            self.stats.hits += shared
        else:
            self.private.add(slot)
        if stored is not None:
            self.stored.touch(stored)
        entry = CachedSequence(slot, list(tokens[:shared]))
        self.live.put(request_id, entry)
        return entry, SlotChoice(slot, donor.state if donor is not None else None, shared=shared, evicted=evicted,
                                 restore=stored.blob if stored is not None else None)

    def finish(self, request_id: str) -> tuple[int | None, list[int] | None]:
        """A request is done: its slot becomes an idle prefix, or with a host-memory tier is freed and
        its tokens returned for the engine to store (`store`) before it clears the slot. An empty one,
        one placed with `share` false, or any when caching is disabled, is freed. Returns the slot to
        clear (None: kept idle, or unknown) and the tokens to store (None: nothing to store)."""
        entry = self.live.release(request_id)
        if entry is None:
            return None, None
        private = entry.state in self.private
        self.private.discard(entry.state)
        cacheable = bool(entry.tokens) and not private and self.enabled
        if cacheable and not self.stored_bytes:
            self.idle[entry.state] = entry
            return None, None
        self.free.append(entry.state)
        return entry.state, entry.tokens if cacheable else None

    def store(self, tokens: list[int], blob: object, size: int) -> None:
        """Keep a finished sequence's cells in host memory: the stored prefixes it extends go, and the
        least recently used ones beyond `stored_bytes`."""
        self.stored.add(tokens, blob, size)

    def drop(self, request_id: str) -> int | None:
        """Forget a live sequence whose cells are unknown (a failed step): its slot, now free, to clear."""
        entry = self.live.release(request_id)
        if entry is None:
            return None
        self.private.discard(entry.state)
        self.free.append(entry.state)
        return entry.state

    def gap_below(self, slot: int) -> int | None:
        """The lowest free slot below `slot`, if any: where a sequence in `slot` can move so that the
        slots in use stay consecutive (`move`)."""
        lower = [free for free in self.free if free < slot]
        return min(lower) if lower else None

    def move(self, entry: CachedSequence[int], slot: int) -> int:
        """Record that a live sequence's cells moved to the free `slot`; returns the slot it left, now free."""
        old = entry.state
        self.free.remove(slot)
        self.free.append(old)
        if old in self.private:
            self.private.discard(old)
            self.private.add(slot)
        entry.state = slot
        return old

    def cached_tokens(self) -> int:
        return self.live.cached_tokens() + sum(len(e.tokens) for e in self.idle.values())

    # -- internals ---------------------------------------------------------------------------------
    def _best_donor(self, tokens: list[int]) -> tuple[CachedSequence[int] | None, int]:
        live = ((entry, entry.tokens) for _, entry in self.live.items() if entry.state not in self.private)
        idle = ((entry, entry.tokens) for entry in self.idle.values())
        return longest_shared(itertools.chain(live, idle), tokens)

    def _free_slot(self, donor: CachedSequence[int] | None, shared: int, busy: Container[str]
                   ) -> tuple[int, int | None]:
        """A slot for a new sequence, and the slot evicted to make it (None: it was free or is taken over)."""
        if self.free:  # the lowest: a llama.cpp step with a KV stream per slot runs consecutive slots together
            slot = min(self.free)
            self.free.remove(slot)
            return slot, None
        donor_slot = donor.state if donor is not None else None
        donor_idle = donor_slot is not None and donor_slot in self.idle
        if donor_idle and 2 * shared >= len(donor.tokens):  # little of the donor would be lost: take it over
            del self.idle[donor_slot]
            return donor_slot, None
        oldest_idle = next((slot for slot in self.idle if slot != donor_slot), None)
        if oldest_idle is not None:
            del self.idle[oldest_idle]
            return oldest_idle, oldest_idle
        if donor_idle:
            del self.idle[donor_slot]
            return donor_slot, None
        donor_id = next((rid for rid, entry in self.live.items() if entry is donor), None)  # a live donor
        victim = self.live.pop_oldest(keep={rid for rid, _ in self.live.items() if rid in busy} | {donor_id})
        if victim is not None:
            self.private.discard(victim.state)
            return victim.state, victim.state
        if donor_id is not None and donor_id not in busy:  # only the live donor rests (its end not yet seen)
            self.live.evict(donor_id)
            self.private.discard(donor_slot)
            return donor_slot, None
        raise RuntimeError(f"all {self.live.capacity} sequences have a call in progress")
