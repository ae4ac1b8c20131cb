"""Stopping on user-given strings in streamed text without ever streaming part of a stop string.

Text that could be the start of a stop string is held back until it can be decided; text from the
stop string on is never emitted (OpenAI semantics).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stops = [s for s in stop_strings if s]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add text; return what can safely be emitted. Sets `stopped` once a stop string appears."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return buf[: min(hits)]
        hold = self._longest_partial_suffix(buf)
        self._pending = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """End of generation: held-back text was not a stop string after all."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _longest_partial_suffix(self, buf: str) -> int:
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
