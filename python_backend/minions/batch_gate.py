"""Forming whole LLM batches: hold LLM calls while a pass runs and release them together once the
requests of the last pass are back, or have had a short window to come back.

Why: Triton's dynamic batcher starts a pass as soon as the model is free, with whatever has queued.
Under plain decoding at 8 streams, the requests that queued during pass A run as pass B the moment A
ends, while A's own requests, a few milliseconds behind, queue for pass C: the load splits into two
cohorts that alternate for good, each half a batch (measured: mean LLM batch 4.0 at 8 streams, 1.0 at
2). A queue delay in Triton does not merge them: it counts from a request's arrival, and the cohort
that waited through a whole pass is past any short delay. The BLS sees every call, so it can wait for
the stragglers instead: after a pass, calls wait (at most `window_s` past each request's last answer)
for the requests of that pass that are likely to call again at once.

A request that goes to its SSMs after verification does not come back within the window, so its
expectation lapses and costs at most the window once. A lone request is never held: it is the one
coming back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .drafting import EngineClient
from .engine_api import EngineRequest, EngineResult

T = TypeVar("T")


class BatchGate:
    """One gate per gated model (the LLM). Pure asyncio; all methods run on the event loop's thread."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.in_flight = 0
        self.waiting: list[asyncio.Future] = []
        self.expected: dict[str, float] = {}  # request key -> when its expectation lapses
        self.passes_released = 0
        self.window_waits = 0
        """Releases that waited for an expected request (a lone request never causes one)."""
        self._timer: asyncio.TimerHandle | None = None
        self._held = False

    async def run(self, key: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call` (one LLM call of request `key`) when the gate releases it."""
        future = asyncio.get_running_loop().create_future()
        self.expected.pop(key, None)
        self.waiting.append(future)
        self._release_if_ready()
        try:
            await future
        except asyncio.CancelledError:
            if future in self.waiting:
                self.waiting.remove(future)
            elif future.done() and not future.cancelled():
                self._finished(None)  # released, but cancelled before it could start
            raise
        try:
            return await call()
        finally:
            self._finished(key)

    def _finished(self, key: str | None) -> None:
        self.in_flight -= 1
        if key is not None and self.window_s > 0:
            self.expected[key] = self.clock() + self.window_s
        self._release_if_ready()

    def _release_if_ready(self) -> None:
        if self.in_flight or not self.waiting:
            return
        now = self.clock()
        self.expected = {k: t for k, t in self.expected.items() if t > now}
        if self.expected:
            self._held = True
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(min(self.expected.values()) - now,
                                                                 self._release_if_ready)
            return
        waited, self.waiting = self.waiting, []
        self.passes_released += 1
        self.window_waits += self._held
        self._held = False
        for future in waited:
            if not future.done():
                self.in_flight += 1
                future.set_result(None)


class GatedClient:
    """An EngineClient whose calls to one model (the LLM) go through a BatchGate. Releases (`stop`)
    are not gated: they do no work in a pass and must not hold one up."""

    def __init__(self, inner: EngineClient, model: str, gate: BatchGate) -> None:
        self.inner = inner
        self.model = model
        self.gate = gate

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        if model != self.model or request.stop:
            return await self.inner.generate(model, request)
        return await self.gate.run(request.request_id, lambda: self.inner.generate(model, request))

    async def release(self, model: str, request_id: str) -> None:
        await self.inner.release(model, request_id)
