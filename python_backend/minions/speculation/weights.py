"""Online SSM weights for the vote, learnt from what the LLM accepts.

After each verification every SSM that drafted is scored by how much of its own draft the LLM's
output confirms (matched tokens / tokens that could be checked), whether or not its path was the
one sent: the LLM's output is known, so each SSM gets feedback every round it drafts.

The update is multiplicative against a threshold, as in Minions, but the threshold is the round's
mean score rather than a constant: w *= exp(eta * (score - mean)). Above-average SSMs gain, the
others lose. A fixed threshold cannot tell two good SSMs apart (both climb to the ceiling: see the
unit tests), and a lone drafter learns nothing it could be compared by. Weights stay within
[floor, ceiling], so an SSM that was bad for a while can still win again (it is never starved).
Weights are kept globally (shared by all requests) and per request (seeded from the global ones).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from minions.decoding.tokens import common_prefix_len


@dataclass(frozen=True)
class WeightRule:
    eta: float = 1.0
    floor: float = 0.05
    ceiling: float = 20.0

    def apply(self, weights: Mapping[str, float], scores: Mapping[str, float]) -> dict[str, float]:
        """New weights of the scored SSMs after one round."""
        if not scores:
            return {}
        threshold = sum(scores.values()) / len(scores)
        return {
            ssm: min(max(weights[ssm] * math.exp(self.eta * (score - threshold)), self.floor), self.ceiling)
            for ssm, score in scores.items()
        }


def draft_score(draft: list[int], emitted: list[int]) -> float | None:
    """Share of the draft the LLM confirmed, over the positions its output lets us check.

    The LLM emits the accepted tokens plus one of its own, so only the first len(emitted) draft
    tokens can be judged; None when nothing can be (an empty draft)."""
    checked = min(len(draft), len(emitted))
    if checked == 0:
        return None
    return common_prefix_len(draft, emitted) / checked


class SsmWeights:
    def __init__(self, names: list[str] | tuple[str, ...], rule: WeightRule = WeightRule(), initial: dict[str, float] | None = None) -> None:
        self.rule = rule
        self._weights = {n: float((initial or {}).get(n, 1.0)) for n in names}
        self._lock = threading.Lock()

    def snapshot(self, names: list[str] | tuple[str, ...] | None = None) -> dict[str, float]:
        with self._lock:
            return {n: self._weights[n] for n in (names if names is not None else self._weights)}

    def add(self, name: str) -> None:
        """An SSM that joined the served ones: it starts at the initial weight (1.0)."""
        with self._lock:
            self._weights.setdefault(name, 1.0)

    def update(self, scores: Mapping[str, float]) -> None:
        """One round's scores (SSM -> draft_score) of the SSMs that drafted."""
        with self._lock:
            self._weights.update(self.rule.apply(self._weights, scores))

    def child(self, names: list[str] | tuple[str, ...]) -> SsmWeights:
        """Per-request weights starting from the current global ones."""
        return SsmWeights(names, self.rule, self.snapshot(names))
