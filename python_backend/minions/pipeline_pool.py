"""The pipeline's throttles: the intermediate draft pool and the KV-cache admission budget.

`DraftPool` is Minions' intermediate result pool seen as a counter of slots: a draft holds a slot from
the moment its drafting starts until it is handed to the LLM for verification (or discarded). When
the pool holds as many drafts as the LLM verifies in one batch, more drafting would only make drafts
that wait, and take CPU from the LLM, so new drafting pauses (`acquire` waits; pipelined early
drafts, which are optional, are simply not started: `try_acquire`).

`KvAdmission` keeps the engines' KV caches within their budget: a request reserves its worst case
(prompt + max new tokens + one round's draft) before it starts decoding, and waits, first come first
served, while the budget is taken. Nothing is dropped; a request that could never fit is refused at
once with an error that says why.

Both are plain asyncio, so they are tested without Triton; slots and reservations are released in
`finally` clauses, so cancelled requests give back what they held.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from .errors import InvalidRequest


class Slot:
    """One held place in the pool; release() is idempotent."""

    def __init__(self, pool: DraftPool) -> None:
        self._pool: DraftPool | None = pool

    def release(self) -> None:
        if self._pool is not None:
            self._pool._release()
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
                await waiter  # _release hands its slot over: held is not decremented for us
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._release()  # the slot was handed over just as we were cancelled
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

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the waiter
                return
        self.held -= 1


@dataclass
class Reservation:
    tokens: int
    admission: KvAdmission | None

    def release(self) -> None:
        if self.admission is not None:
            self.admission._give_back(self.tokens)
            self.admission = None


class KvAdmission:
    """A budget of KV tokens in flight; requests reserve their worst case and wait for room in order."""

    def __init__(self, capacity_tokens: int, chunk: int = 1) -> None:
        self.capacity = capacity_tokens
        self.chunk = max(1, chunk)
        self.in_use = 0
        self.peak = 0
        self._queue: deque[tuple[int, asyncio.Future]] = deque()

    def need(self, tokens: int) -> int:
        """Tokens rounded up to the engine's allocation chunk (what its cache will really hold)."""
        return -(-tokens // self.chunk) * self.chunk

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def fits_now(self, tokens: int) -> bool:
        """Whether reserve(tokens) would be granted at once (room, and nobody queued before it)."""
        return not self._queue and self.in_use + self.need(tokens) <= self.capacity

    async def reserve(self, tokens: int) -> Reservation:
        need = self.need(tokens)
        if need > self.capacity:
            raise InvalidRequest(
                f"the request needs up to {need} tokens of KV cache (prompt + max_tokens + draft); the "
                f"deployment's budget is {self.capacity}: lower max_tokens or shorten the prompt"
            )
        if self.fits_now(tokens):
            self._take(need)
            return Reservation(need, self)
        waiter = asyncio.get_running_loop().create_future()
        entry = (need, waiter)
        self._queue.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if entry in self._queue:
                self._queue.remove(entry)
                self._admit()  # a later, smaller request may fit now
            elif waiter.done() and not waiter.cancelled():
                self._give_back(need)
            raise
        return Reservation(need, self)

    def _take(self, need: int) -> None:
        self.in_use += need
        self.peak = max(self.peak, self.in_use)

    def _give_back(self, tokens: int) -> None:
        self.in_use -= tokens
        self._admit()

    def _admit(self) -> None:
        """Admit queued requests in order while the first one fits (no overtaking: no starvation)."""
        while self._queue and self.in_use + self._queue[0][0] <= self.capacity:
            need, waiter = self._queue.popleft()
            if waiter.done():
                continue
            self._take(need)
            waiter.set_result(None)
