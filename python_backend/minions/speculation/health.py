"""Which SSMs are worth asking right now, shared by all requests (a circuit breaker).

An SSM whose stub died, or that keeps failing, costs every round a failed call (about a second for a
dead stub in Triton 2.51). After `threshold` failures in a row it is skipped by every request for
`cooldown_s`, then tried again; one success closes the breaker.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class SsmHealth:
    def __init__(self, threshold: int = 3, cooldown_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}

    def available(self, ssm: str) -> bool:
        return self.clock() >= self._open_until.get(ssm, 0.0)

    def failed(self, ssm: str) -> bool:
        """Record a failure; True when this one opened the breaker."""
        self._failures[ssm] = self._failures.get(ssm, 0) + 1
        if self._failures[ssm] >= self.threshold:
            self._failures[ssm] = 0
            self._open_until[ssm] = self.clock() + self.cooldown_s
            return True
        return False

    def succeeded(self, ssm: str) -> None:
        self._failures[ssm] = 0
        self._open_until.pop(ssm, None)
