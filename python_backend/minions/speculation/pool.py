"""The pipeline's throttle: Minions' intermediate draft pool.

`DraftPool` is the intermediate result pool seen as a counter of slots: a draft holds a slot from
the moment its drafting starts until it is handed to the LLM for verification (or discarded). When
the pool holds as many drafts as the LLM verifies in one batch, more drafting would only make drafts
that wait, and take CPU from the LLM, so new drafting pauses (`acquire` waits; pipelined early
drafts, which are optional, are simply not started: `try_acquire`).

Plain asyncio, so it is tested without Triton; slots are released in `finally` clauses, so
cancelled requests give back what they held.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slot:
    """One held place in the pool; release() is idempotent."""

    def __init__(self, pool: DraftPool) -> None:
        self._pool: DraftPool | None = pool

    def release(self) -> None:
        if self._pool is not None:
            self._pool.give_back()
            self._pool = None

    @property
    def held(self) -> bool:
        return self._pool is not None


class DraftPool:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("the draft pool needs at least one slot")
        self.capacity = capacity
        self.held = 0
        self.peak = 0
        self.waits = 0
        self._waiters: deque[asyncio.Future] = deque()

    def _full(self) -> bool:
        """No free slot, or someone waits for one (a newcomer never overtakes)."""
        return self.held >= self.capacity or bool(self._waiters)

    async def acquire(self) -> Slot:
        """A slot, waiting (first come, first served) while the pool is full."""
        if self._full():
            self.waits += 1
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # give_back hands its slot over: held is not decremented for us
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self.give_back()  # the slot was handed over just as we were cancelled
                raise
            return Slot(self)
        self._take()
        return Slot(self)

    def try_acquire(self) -> Slot | None:
        """A slot if one is free now (nobody waiting), else None."""
        if self._full():
            return None
        self._take()
        return Slot(self)

    def _take(self) -> None:
        self.held += 1
        self.peak = max(self.peak, self.held)

    def give_back(self) -> None:
        """A held slot is free again: it passes straight to the first waiter, if any (Slot.release)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the waiter
                return
        self.held -= 1
