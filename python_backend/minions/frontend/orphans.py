"""Generations that a dead orchestrator stub left without an answer, found and ended.

Triton 2.51 never answers the requests a `minions` stub was serving when it died (killed, out of
memory): their response factories die with it, and a client waits until its own deadline
(docs/operations.md, "A dead `minions` stub"). The frontend runs beside tritonserver, so it watches the
model's stub processes in /proc while generations are in flight. When a stub it saw has gone, a
generation sent before any newer stub started can only have gone to a vanished one; if such a
generation then hears nothing for `grace_s`, it is an orphan, and the frontend ends it with
UNAVAILABLE (an OpenAI client gets 503 and retries) instead of letting its client hang.

A stub that exits normally (the model reloaded or unloaded) has answered its requests first, since
Triton waits for them; the grace covers a last response still on its way. The stub of a newer
instance starts before Triton routes a request to it, so a generation sent after that start is never
taken for an orphan. The rule assumes one instance of the model (`instance_count` is 1). A stub killed
during a reload, after the new instance's stub started and before Triton routes to it, leaves the
requests sent in between to their clients' deadlines: ending them would risk ending the new stub's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger("minions.frontend")

ORPHAN_GRACE_S = 2.0
"""How long a generation sent to a vanished stub may stay silent before it is ended."""

POLL_S = 1.0
"""How often the stubs are looked at while generations are in flight."""

ORPHANED = ("the orchestrator's process died while this request was under way; the server is loading it "
            "again: retry later")
"""The message a generation ended as an orphan gets (a refusal's status: UNAVAILABLE, 503)."""


def orphan_bound(before: Mapping[int, float], now: Mapping[int, float], observed_at: float) -> float | None:
    """None when every stub of `before` (pid -> start time) still lives in `now`; otherwise the time
    before which a generation can only have been sent to a vanished stub: the start of the first stub
    newer than every vanished one, or `observed_at` when there is none yet."""
    vanished = [start for pid, start in before.items() if now.get(pid) != start]
    if not vanished:
        return None
    newer = [start for start in now.values() if start > max(vanished)]
    return min(newer, default=observed_at)


@dataclass(eq=False)
class Watched:
    """One generation in flight: when it was sent, when it last heard from Triton, and how to end it."""

    sent: float
    cancel: Callable[[], None]
    heard: float = field(init=False)
    suspect_since: float | None = None
    orphaned: bool = False

    def __post_init__(self) -> None:
        self.heard = self.sent


class OrphanWatch:
    """Watches the stubs (`starts`: pid -> start time, e.g. triton/stubs.stub_start_times of the
    model's folder) while generations are in flight, and ends the ones a vanished stub left: their
    `cancel` is called and `orphaned` set."""

    def __init__(self, starts: Callable[[], dict[int, float]], clock: Callable[[], float],
                 grace_s: float = ORPHAN_GRACE_S, interval_s: float = POLL_S) -> None:
        self.starts = starts
        self.clock = clock
        self.grace_s = grace_s
        self.interval_s = interval_s
        self._stubs: dict[int, float] | None = None
        self._watched: set[Watched] = set()
        self._task: asyncio.Task | None = None

    def watch(self, cancel: Callable[[], None]) -> Watched:
        """A generation sent now; the watch runs (on the running loop) while any is in flight."""
        if self._stubs is None:
            self._stubs = self.starts()
        watched = Watched(self.clock(), cancel)
        self._watched.add(watched)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return watched

    def heard(self, watched: Watched) -> None:
        watched.heard = self.clock()

    def forget(self, watched: Watched) -> None:
        self._watched.discard(watched)

    def poll(self) -> list[Watched]:
        """One look at the stubs: the generations found orphaned now (already cancelled)."""
        now, stubs = self.clock(), self.starts()
        bound = orphan_bound(self._stubs or {}, stubs, now)
        self._stubs = stubs
        if bound is not None:
            for watched in self._watched:
                if watched.sent < bound and watched.suspect_since is None:
                    watched.suspect_since = now
        ended = []
        for watched in list(self._watched):
            if watched.suspect_since is None:
                continue
            if watched.heard > watched.suspect_since:  # answered by a live stub after all
                watched.suspect_since = None
            elif now - watched.suspect_since >= self.grace_s:
                watched.orphaned = True
                self._watched.discard(watched)
                watched.cancel()
                ended.append(watched)
        if ended:
            log.error("the orchestrator's stub died: %d generation(s) it was serving ended with 503", len(ended))
        return ended

    async def _run(self) -> None:
        while self._watched:
            await asyncio.sleep(self.interval_s)
            try:
                self.poll()
            except OSError as exc:  # /proc unreadable: nothing is ended on a guess
                log.warning("orchestrator stub watch: %s", exc)
