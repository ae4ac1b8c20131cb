"""The KV cells behind a llama.cpp context's slots: where a request's sequence lives, and how cells move
between slots and host memory so that the slots work as a prefix cache (prefix_cache.py keeps the
books; this moves the cells they describe).

A new request's slot starts with the cells of the longest cached prefix: shared with a live or idle
slot (`seq_cp` on the unified KV buffer shares cells; across KV streams they are copied through host
memory now, since llama.cpp's own cross-stream copy is only queued for the next decode) or restored
from host memory. A finished request's cells go to host memory within the prefix cache's budget, and
its slot is cleared.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

from minions.decoding.engine_call import EngineRequest
from minions.engines.prefix_cache import PrefixCache, SlotChoice
from minions.engines.sequence_cache import CachedSequence


class SlotCells:
    """The cells of one llama.cpp context's slots (`ctx`: llama-cpp-python's LlamaContext), kept as
    `books` says; used from the batcher's thread only."""

    def __init__(self, ctx, books: PrefixCache, kv_unified: bool) -> None:
        self._ctx = ctx
        self.books = books
        self.kv_unified = kv_unified

    def slot_for(self, request: EngineRequest, sequence: list[int], busy: set[str]) -> CachedSequence[int]:
        """The request's slot; a new request's starts with the cells of the longest cached prefix
        (`busy`: requests with a call in progress, whose slots are never evicted)."""
        entry = self.books.live.get(request.request_id)
        if entry is not None:
            return entry
        # The batcher starts at most max_sequences calls at once, so a slot is always found.
        entry, choice = self.books.place(request.request_id, sequence, busy=busy, share=request.shares_prefix)
        self.clear(choice.evicted)
        if not self._share(choice):  # no room for its cells: computed from scratch
            entry.tokens = []
            self.clear(choice.slot)
            return entry
        self.trim(choice.slot, choice.shared)
        return entry

    def trim(self, slot: int, keep: int) -> None:
        """Remove a slot's cells from position `keep` on (a rewound prefix, a rejected draft)."""
        self._ctx.kv_cache_seq_rm(slot, keep, -1)

    def finish(self, request_id: str) -> None:
        """The request is done: its cells go to host memory (or its slot stays as an idle prefix)."""
        slot, tokens = self.books.finish(request_id)
        if slot is not None and tokens:
            blob = self._blob(slot, self.books.stored_bytes)
            if blob is not None:
                self.books.store(tokens, *blob)
        self.clear(slot)

    def drop(self, request_id: str) -> None:
        """Forget a sequence whose cells are unknown after a failed step: its slot is cleared."""
        self.clear(self.books.drop(request_id))

    def close_gaps(self, entries: Iterable[CachedSequence[int]]) -> None:
        """With a KV stream per slot, llama.cpp runs a step in one ubatch per run of consecutive slots,
        so a free slot among the step's (a sequence ended, no new one took its place) costs every later
        step an extra ubatch (docs/engines.md). So the highest-placed sequences move down into free
        slots below them, their cells copied through host memory once."""
        for entry in sorted(entries, key=lambda e: e.state, reverse=True):
            slot = self.books.gap_below(entry.state)
            if slot is None:
                return
            if not self._copy(entry.state, slot):  # no cells yet, or no room: it stays where it is
                self.clear(slot)
                return
            self.clear(self.books.move(entry, slot))

    def clear(self, slot: int | None) -> None:
        """Remove every KV cell of a slot the books freed or evicted (None: nothing to clear)."""
        if slot is not None:
            self._ctx.kv_cache_seq_rm(slot, -1, -1)

    def _share(self, choice: SlotChoice) -> bool:
        """Put the shared prefix's cells in the chosen slot: restored from host memory, shared with a live
        or idle donor in the unified buffer, or copied from it across streams. False: no room for them."""
        if choice.restore is not None:
            return self._restore(choice.slot, choice.restore)
        if choice.donor is None or choice.donor == choice.slot:
            return True
        if self.kv_unified:
            self._ctx.kv_cache_seq_cp(choice.donor, choice.slot, 0, choice.shared)
            return True
        return self._copy(choice.donor, choice.slot)

    def _copy(self, donor: int, slot: int) -> bool:
        """Copy a live sequence's cells into another stream now, through host memory. llama.cpp's own
        `seq_cp` across streams only queues the copy for the next decode, by when a slot freed meanwhile
        may hold other cells (a restored prefix), which the copy would then carry over or overwrite."""
        blob = self._blob(donor)
        return blob is not None and self._restore(slot, blob[0])

    def _blob(self, slot: int, limit: int | None = None) -> tuple[ctypes.Array, int] | None:
        """A slot's KV cells in host memory and their size (None: none, or more than `limit` bytes)."""
        import llama_cpp

        ctx = self._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, slot)
        if not size or (limit is not None and size > limit):
            return None
        blob = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, blob, size, slot)
        return (blob, written) if written else None

    def _restore(self, slot: int, blob) -> bool:
        """Copy stored KV cells into an empty slot; False when the KV buffer had no room for them."""
        import llama_cpp

        return llama_cpp.llama_state_seq_set_data(self._ctx.ctx, blob, ctypes.sizeof(blob), slot) > 0
