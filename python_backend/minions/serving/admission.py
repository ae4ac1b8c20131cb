"""Admission: requests start decoding only while the LLM has room for one more sequence.

Room is a sequence slot (the LLM engine's `max_sequences`: beyond it, engines evict live sequences
and recompute them, and throughput collapses) and, where the deployment sets a KV budget, the
request's worst case in KV tokens (prompt + max new tokens + one round's draft). A finished request
gives its slot back once its LLM release is queued (`Reservation.sequence_released`), its tokens once
the release is done: a client that sends its next request on the last one's answer does not wait a
whole LLM step for the release's answer before its prompt goes in (in-flight engines take a stop
before the new calls behind it at the same step boundary). A request without
room waits, first come first served. Nothing is dropped, unless the wait queue is full: then the
request is refused at once (ServerBusy, Triton's UNAVAILABLE), and a request that could never fit is
refused with an error that says why. Plain asyncio; a reservation is released in a `finally` clause,
so a cancelled request gives back what it held.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from minions.errors import InvalidRequest, ServerBusy


@dataclass
class Reservation:
    tokens: int
    admission: Admission | None
    answered: bool = False
    slot_given_back: bool = False

    def answer_sent(self) -> None:
        """The client has its final response: the request no longer counts as decoding (the load that
        speculation reads), though it holds its slot and tokens until its engines' state is freed."""
        if self.admission is not None and not self.answered:
            self.answered = True
            self.admission.answer_sent()

    def sequence_released(self) -> None:
        """The LLM's release of the request's sequence is queued: any call sent to the LLM from now on
        reaches it behind the release, so the slot may go to the next request; the tokens stay held
        until `release`."""
        if self.admission is not None and not self.slot_given_back:
            self.slot_given_back = True
            self.admission.slot_freed()

    def release(self) -> None:
        """The request's engines' state is freed: its slot and tokens go back (once)."""
        if self.admission is not None:
            self.admission.give_back(self)
            self.admission = None


class Admission:
    """At most `max_sequences` requests decoding, holding at most `capacity_tokens` KV tokens (0: no
    token budget); up to `max_queued` more wait in order (0: no bound)."""

    def __init__(self, max_sequences: int, capacity_tokens: int = 0, chunk: int = 1, max_queued: int = 0,
                 on_change: Callable[[int, int, float], None] = lambda running, waiting, kv_usage: None) -> None:
        """`on_change` is told the requests running and waiting and the KV use (`kv_usage`) whenever
        any changes."""
        self.max_sequences = max_sequences
        self.on_change = on_change
        self.capacity = capacity_tokens
        self.chunk = max(1, chunk)
        self.max_queued = max_queued
        self.running = 0
        self.answered = 0
        """Running requests whose final response is sent, freeing their engines' state."""
        self.slots_given_back = 0
        """Running requests whose LLM release is queued: their slots count as free."""
        self.in_use = 0
        self.peak = 0
        self._queue: deque[tuple[int, asyncio.Future]] = deque()

    def need(self, tokens: int) -> int:
        """Tokens rounded up to the engine's allocation chunk (what its cache will really hold)."""
        return -(-tokens // self.chunk) * self.chunk if self.capacity else 0

    @property
    def decoding(self) -> int:
        """Requests still producing tokens: a client that sends its next request on the last one's
        final response finds the last one no longer decoding, though it may still hold its slot."""
        return self.running - self.answered

    @property
    def holding_slots(self) -> int:
        """Requests holding a sequence slot: the running ones but those whose LLM release is queued."""
        return self.running - self.slots_given_back

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def kv_usage(self) -> float:
        """How full the KV cache is, 0-1 (vLLM's kv_cache_usage_perc): the tokens admitted requests may
        hold at most over the budget; without a token budget, the sequence slots held over the slots."""
        if self.capacity:
            return self.in_use / self.capacity
        return self.holding_slots / self.max_sequences if self.max_sequences else 0.0

    def _room(self, need: int) -> bool:
        return self.holding_slots < self.max_sequences and (not self.capacity or self.in_use + need <= self.capacity)

    def fits_now(self, tokens: int) -> bool:
        """Whether reserve(tokens) would be granted at once (room, and nobody queued before it)."""
        return not self._queue and self._room(self.need(tokens))

    async def reserve(self, tokens: int) -> Reservation:
        need = self.need(tokens)
        if self.capacity and need > self.capacity:
            raise InvalidRequest(
                f"the request needs up to {need} tokens of KV cache (prompt + max_tokens + draft); the "
                f"deployment's budget is {self.capacity}: lower max_tokens or shorten the prompt"
            )
        if self.fits_now(tokens):
            self._take(need)
            self._changed()
            return Reservation(need, self)
        if self.max_queued and len(self._queue) >= self.max_queued:
            raise ServerBusy(f"{ServerBusy.PREFIX} ({self.running} requests decoding, {len(self._queue)} waiting, "
                             "the most it queues): retry later")
        waiter = asyncio.get_running_loop().create_future()
        entry = (need, waiter)
        self._queue.append(entry)
        self._changed()
        try:
            await waiter
        except asyncio.CancelledError:
            if entry in self._queue:
                self._queue.remove(entry)
                self._admit()  # a later, smaller request may fit now
                self._changed()
            elif waiter.done() and not waiter.cancelled():
                self._give_back(need)
            raise
        return Reservation(need, self)

    def answer_sent(self) -> None:
        """A running request's final response is sent: it no longer counts as decoding."""
        self.answered += 1

    def slot_freed(self) -> None:
        """A running request's LLM release is queued: its slot counts as free, and waiters that fit start."""
        self.slots_given_back += 1
        self._admit()
        self._changed()

    def give_back(self, reservation: Reservation) -> None:
        """A reservation ends: what it held (and counted as answered or as a slot freed) comes back."""
        self.answered -= int(reservation.answered)
        self.slots_given_back -= int(reservation.slot_given_back)
        self._give_back(reservation.tokens)

    def _take(self, need: int) -> None:
        """Its callers tell on_change once they are done (a release that admits a waiter: once)."""
        self.running += 1
        self.in_use += need
        self.peak = max(self.peak, self.in_use)

    def _give_back(self, tokens: int) -> None:
        self.running -= 1
        self.in_use -= tokens
        self._admit()
        self._changed()

    def _changed(self) -> None:
        self.on_change(self.running, self.waiting, self.kv_usage)

    def _admit(self) -> None:
        """Admit queued requests in order while the first one fits (no overtaking: no starvation)."""
        while self._queue and self._room(self._queue[0][0]):
            need, waiter = self._queue.popleft()
            if waiter.done():
                continue
            self._take(need)
            waiter.set_result(None)
