"""Which SSMs are worth asking right now, shared by all requests: readiness and a circuit breaker.

An SSM whose stub died, or that keeps failing, costs every round a failed call. After `threshold`
failures in a row it is skipped by every request for `cooldown_s`, then tried again; one success
closes the breaker. A call silent for `call_timeout_s` counts as a failure, so no round waits on an
SSM without bound. An SSM the server reports not ready (unloaded by an operator, or reloading) is
skipped until it is ready again, and then gets a fresh start: its breaker closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from minions.settings import DEFAULTS, SsmHealthSettings

_DEFAULT = DEFAULTS.ssm_health


class SsmHealth:
    def __init__(self, threshold: int = _DEFAULT.breaker_threshold, cooldown_s: float = _DEFAULT.breaker_cooldown_s,
                 call_timeout_s: float = _DEFAULT.call_timeout_s, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.call_timeout_s = call_timeout_s
        self.clock = clock
        self.on_open: Callable[[str, str], None] | None = None
        """Called with the SSM and the failure's message when its breaker opens (e.g. to reload it)."""
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}
        self._not_ready: set[str] = set()

    @classmethod
    def of(cls, settings: SsmHealthSettings) -> SsmHealth:
        """The breaker a deployment's settings describe."""
        return cls(settings.breaker_threshold, settings.breaker_cooldown_s, settings.call_timeout_s)

    def available(self, ssm: str) -> bool:
        return ssm not in self._not_ready and self.clock() >= self._open_until.get(ssm, 0.0)

    def failed(self, ssm: str, reason: str = "") -> bool:
        """Record a failure; True when this one opened the breaker."""
        self._failures[ssm] = self._failures.get(ssm, 0) + 1
        if self._failures[ssm] >= self.threshold:
            self._failures[ssm] = 0
            self._open_until[ssm] = self.clock() + self.cooldown_s
            if self.on_open is not None:
                self.on_open(ssm, reason)
            return True
        return False

    def succeeded(self, ssm: str) -> None:
        self._failures[ssm] = 0
        self._open_until.pop(ssm, None)

    def set_ready(self, ssm: str, ready: bool) -> None:
        """The server's word on the SSM's model: not ready, it is skipped; ready again, its breaker closes."""
        if not ready:
            self._not_ready.add(ssm)
        elif ssm in self._not_ready:
            self._not_ready.discard(ssm)
            self.succeeded(ssm)
