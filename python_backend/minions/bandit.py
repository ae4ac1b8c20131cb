"""SPIN-style learnt SSM selection: UCB1 over the SSMs, rewarded by tokens per second.

Each round the policy picks one SSM; the reward is what that round achieved per unit of time,
emitted tokens / (drafting + verification seconds), so a cheap SSM with middling acceptance can beat
an accurate but slow one. UCB1 needs rewards in [0, 1]: they are divided by the best reward seen so
far. No prior knowledge of request difficulty is used; each arm is tried once first.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


@dataclass
class Arm:
    pulls: int = 0
    reward_sum: float = 0.0

    @property
    def mean(self) -> float:
        return self.reward_sum / self.pulls if self.pulls else 0.0


class Ucb1:
    def __init__(self, names: list[str] | tuple[str, ...], exploration: float = 1.0) -> None:
        self.exploration = exploration
        self.arms = {n: Arm() for n in names}
        self._scale = 0.0
        self._lock = threading.Lock()

    def choose(self, available: list[str] | tuple[str, ...]) -> str | None:
        """The arm to pull now among `available` (unpulled arms first, in the given order)."""
        with self._lock:
            if not available:
                return None
            for name in available:
                if self.arms[name].pulls == 0:
                    return name
            total = sum(self.arms[n].pulls for n in available)
            return max(available, key=lambda n: self._ucb(n, total))

    def _ucb(self, name: str, total: int) -> float:
        arm = self.arms[name]
        return arm.mean + self.exploration * math.sqrt(2.0 * math.log(total) / arm.pulls)

    def reward(self, name: str, tokens_per_second: float) -> None:
        """Record one round's raw reward (normalised here by the best seen so far)."""
        with self._lock:
            if tokens_per_second > self._scale:
                # Rescale the past so every stored reward stays in [0, 1] under the new maximum.
                factor = self._scale / tokens_per_second if self._scale else 0.0
                for arm in self.arms.values():
                    arm.reward_sum *= factor
                self._scale = tokens_per_second
            arm = self.arms[name]
            arm.pulls += 1
            arm.reward_sum += tokens_per_second / self._scale if self._scale else 0.0

    def means(self) -> dict[str, float]:
        with self._lock:
            return {n: a.mean for n, a in self.arms.items()}
