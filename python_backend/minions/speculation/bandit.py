"""SPIN-style learnt SSM selection: UCB1 over the SSMs, rewarded by tokens per second.

Each round the policy picks one SSM; the reward is what that round achieved per unit of time,
emitted tokens / (drafting + verification seconds), so a cheap SSM with middling acceptance can beat
an accurate but slow one. UCB1 needs rewards in [0, 1]: they are divided by the best reward seen so
far. No prior knowledge of request difficulty is used; each arm is tried once first.
`BanditDrafter` is the drafter that asks the policy's pick each round.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from minions.decoding.engine_call import EngineClient
from minions.speculation.drafters import DraftRound, Proposal, ask_one
from minions.speculation.health import SsmHealth


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

    def add(self, name: str) -> None:
        """An SSM that joined the served ones: a new arm, pulled first."""
        with self._lock:
            self.arms.setdefault(name, Arm())

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


class BanditDrafter:
    """SPIN-style selection: a bandit shared by all requests picks the SSM of each round."""

    def __init__(self, ssms: tuple[str, ...], health: SsmHealth, bandit: Ucb1, sampled: bool) -> None:
        self.ssms = ssms
        self.health = health
        self.bandit = bandit
        self.sampled = sampled

    async def propose(self, client: EngineClient, rnd: DraftRound) -> Proposal:
        t0 = time.perf_counter()
        ssm = self.bandit.choose([s for s in self.ssms if self.health.available(s)])
        control = time.perf_counter() - t0
        if ssm is None:
            return Proposal(control_seconds=control)
        proposal = await ask_one(client, self.health, ssm, rnd, sampled=self.sampled)
        proposal.chosen = ssm  # rewarded even when it proposed nothing: that round was plain decoding
        proposal.control_seconds = control
        return proposal

    def observe(self, proposal: Proposal, emitted: list[int], draft_seconds: float, verify_seconds: float) -> float:
        if proposal.chosen is None:
            return 0.0
        t0 = time.perf_counter()
        rate = 0.0 if proposal.failed else len(emitted) / max(draft_seconds + verify_seconds, 1e-6)
        self.bandit.reward(proposal.chosen, rate)
        return time.perf_counter() - t0
