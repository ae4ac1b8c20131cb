"""An engine model's outbox: the thread that sends its responses, exports its gauges and asks Triton
whether clients of requests under way have gone (engine_model.py)."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from minions.serving.metric_tally import METRICS_FLUSH_INTERVAL_S

from .common import CANCEL_CHECK_INTERVAL_S

log = logging.getLogger("minions.engine")


class Watched(Protocol):
    """A request the outbox asks Triton about until it is answered (engine_model's collector)."""

    cancelled: bool
    arrival_ns: int
    sender: Any
    """Its response sender (`is_cancelled()`: whether its client has gone)."""

    def cancel(self) -> None:
        """The client has gone: the request's calls end."""


class Outbox:
    """Sends an in-flight engine's responses from a thread of its own, in the order they are queued, so
    that the engine's thread goes back to stepping at once instead of building and handing each
    response to Triton between two decode steps (a streamed token each step). It also exports the
    engine's gauges (`observe`): every METRICS_FLUSH_INTERVAL_S while it sends, once when it falls
    quiet, and before the answer to a call that frees or keeps a sequence (`export_gauges`). And it
    asks Triton every CANCEL_CHECK_INTERVAL_S whether the client of a request under way has gone (a
    gRPC stream closed, a dead orchestrator's among them): that request's calls then end
    (`Watched.cancel`) instead of decoding on for no one and holding the model's unload.
    A model that answers from `execute` (not decoupled) uses it for the gauges alone (`changed`): a
    lookup drafter's call is a fraction of a millisecond of work, which exporting its changed gauges
    from `execute` (a round trip to tritonserver each) would multiply."""

    def __init__(self, name: str, observe: Callable[[], None]) -> None:
        self._observe = observe
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._live: set[Watched] = set()
        """Requests not answered FINAL yet (the outbox's thread only)."""
        self._thread = threading.Thread(target=self._loop, name=f"{name}-outbox", daemon=True)
        self._thread.start()

    def put(self, send: Callable[[], None]) -> None:
        self._queue.put(send)

    def watch(self, collector: Watched) -> None:
        """Ask about `collector`'s request until it is answered; called before its calls are submitted,
        so queued before any of their answers."""
        self._queue.put(_Watch(collector))

    def changed(self) -> None:
        """The engine's state changed outside a response sent here (a batch answered from `execute`):
        its gauges are exported as after a response."""
        self._queue.put(_CHANGED)

    def export_gauges(self) -> None:
        """On the outbox's thread: export the engine's gauges now, before the response about to go out
        (one that ends or keeps a sequence's state), whatever the flush interval."""
        _logged(self._observe, "exporting the engine's gauges")

    def answered(self, collector: Watched) -> None:
        """On the outbox's thread: `collector` sent its FINAL response."""
        self._live.discard(collector)

    def close(self) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        observed_at = sent_at = checked_at = 0.0
        pending = False  # responses went out since the gauges were exported
        while True:
            now = time.monotonic()
            due = [t for t, wanted in ((sent_at + METRICS_FLUSH_INTERVAL_S, pending),
                                       (checked_at + CANCEL_CHECK_INTERVAL_S, bool(self._live))) if wanted]
            try:
                item = self._queue.get(timeout=max(0.0, min(due) - now) if due else None)
            except queue.Empty:
                item = _QUIET
            if item is None:
                return
            now = time.monotonic()
            if isinstance(item, _Watch):
                self._live.add(item.collector)
            elif item is not _QUIET:
                if item is not _CHANGED:
                    _logged(item, "sending a response")  # a closed stream must not stop the others' responses
                pending, sent_at = True, now
            if self._live and now - checked_at >= CANCEL_CHECK_INTERVAL_S:
                _logged(self._end_cancelled, "asking Triton whether clients cancelled")
                checked_at = now
            if pending and (now - sent_at >= METRICS_FLUSH_INTERVAL_S or now - observed_at >= METRICS_FLUSH_INTERVAL_S):
                _logged(self._observe, "exporting the engine's gauges")
                observed_at, pending = now, False

    def _end_cancelled(self) -> None:
        """Cancel the requests whose client has gone; one question to Triton per request under way for
        longer than the check interval (a draft or a verification is usually answered sooner)."""
        old = time.time_ns() - int(CANCEL_CHECK_INTERVAL_S * 1e9)
        for collector in list(self._live):
            if not collector.cancelled and collector.arrival_ns <= old and collector.sender.is_cancelled():
                collector.cancel()


@dataclasses.dataclass(frozen=True)
class _Watch:
    """What the outbox's loop gets to start asking about a request."""

    collector: Watched


_QUIET = object()
"""What the outbox's loop gets when nothing was queued before its next flush or check was due."""
_CHANGED = object()
"""Queued by `Outbox.changed`."""


def _logged(call: Callable[[], None], what: str) -> None:
    try:
        call()
    except Exception:
        log.exception("%s failed", what)
