"""KV-cache admission: requests start decoding only while their worst case fits the LLM's KV budget.

A request reserves its worst case (prompt + max new tokens + one round's draft) before it starts
decoding, and waits, first come first served, while the budget is taken. Nothing is dropped; a
request that could never fit is refused at once with an error that says why. Plain asyncio; a
reservation is released in a `finally` clause, so a cancelled request gives back what it held.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from minions.errors import InvalidRequest


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
