"""A draft priced by its own chances: how many of its tokens are worth verifying at this load
(`cheapest_verification`), and how one request's drafts have fared against such chances
(`ChanceCalibration`).

Where the length policy (draft_length.py) prices lengths by what a request's drafts were accepted on
average, this prices the draft at hand: a long copy's chances stay high, a short match's fall at once
(docs/adaptive-draft-length.md, "Drafts cut by their own chances").

Worked example: a suffix draft of 4 tokens whose chances of being right so far are 0.95, 0.9, 0.5,
0.2, on an LLM whose verification of k tokens costs t(0..4) = 11, 16, 21, 25, 32 ms. Expected tokens
E(k) = 1 + the chances so far: 1.95, 2.85, 3.35, 3.55; time per token t(k) / E(k): 11.0 (a plain
step), 8.2, 7.4, 7.5, 9.0 ms; so 2 tokens are verified, the draft's last two priced out. Found by a
probe, the same draft also pays for the plain stream it stops (a call before the next streamed token,
say 9 ms more than a step): its 2 tokens then cost (21 + 9) / 2.85 = 10.5 ms a token, still under a
plain step's 11.0, and are verified; at 13 ms more, 11.9, and the stream goes on.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from minions.decoding.tokens import draft_outcome


def survival(log_probs: Sequence[float]) -> list[float]:
    """The chance that a draft's first 1, 2, ... tokens are all right, from each token's log prob given
    the ones before it (what the lookup engines answer as `output_log_probs`)."""
    return [math.exp(x) for x in itertools.accumulate(log_probs)]


def worth_verifying(log_probs: Sequence[float], verify: Mapping[int, float | None], scale: float = 1.0,
                    overhead: float = 0.0) -> int:
    """`cheapest_verification`'s length."""
    return cheapest_verification(log_probs, verify, scale, overhead)[0]


def cheapest_verification(log_probs: Sequence[float], verify: Mapping[int, float | None],
                          scale: float = 1.0, overhead: float = 0.0) -> tuple[int, float | None]:
    """How many of a draft's tokens to verify, and the expected seconds per emitted token that costs
    (None while unmeasured), from the drafter's own estimate of each token's chance
    (`log_probs`: of being right given the ones before it were): the k with the least expected time
    per emitted token, t(k) / E(k) with E(k) = 1 + sum_{i<=k} min(1, scale * prod_{j<=i} p_j), and 0
    (no verification) when no k beats a plain step, t(0) / 1. `verify`: the LLM's t(b, k) at the
    current load, k = 0..len(log_probs) (VerifyCostTable.estimates); while unmeasured (None) the draft
    is kept whole, as the length policy chose it. `scale`: how the request's drafts have fared against
    such estimates (`ChanceCalibration`). `overhead`: seconds a verification costs beyond t(b, k) (a
    probe's: the plain stream it stops, VerifyCostTable.restart_extra): the length is chosen without
    it, and kept only while it still beats a plain step with it. (Spread over more tokens it would
    lengthen every verified draft, where the chances are the drafter's averages and often too high.)

    Where the length policy prices lengths by what the request's drafts were accepted (on average),
    this prices the draft at hand: a long copy's chances stay high, a short match's fall at once
    (docs/adaptive-draft-length.md, "Drafts cut by their own chances")."""
    n = len(log_probs)
    if n == 0 or any(verify.get(k) is None for k in range(n + 1)):
        return n, None
    best, best_cost, best_expected, expected = 0, verify[0], 1.0, 1.0
    for k, alive in enumerate(survival(log_probs), start=1):
        expected += min(1.0, scale * alive)
        cost = verify[k] / expected  # type: ignore[operator]
        if cost < best_cost:
            best, best_cost, best_expected = k, cost, expected
    if best and overhead:
        with_overhead = (verify[best] + overhead) / best_expected  # type: ignore[operator]
        return (best, with_overhead) if with_overhead < verify[0] else (0, verify[0])  # type: ignore[operator]
    return best, best_cost


class ChanceCalibration:
    """One request's drafts: tokens right against the tokens their chances expected, as a factor on
    those chances (1 before any evidence, `prior` tokens' worth of it; within [1/bound, bound]).
    A drafter's chances are learnt over all its drafts, but a request's text copies more or less than
    the average one (code edits, for one, copy more than chat).

    Verified drafts count as the LLM judged them (`observe`). A draft priced out whole is never
    verified, so it is kept (`priced_out`) and scored against the text that follows it (`settle`):
    otherwise a request whose drafts were all priced out would never learn that it copies, and a short
    copy on a server whose lookups had mostly been wrong would be decoded plainly to its end."""

    def __init__(self, prior: float = 8.0, bound: float = 2.0) -> None:
        self.prior, self.bound = prior, bound
        self.expected = self.accepted = 0.0
        self.pending: list[tuple[int, list[int], list[float]]] = []
        """Drafts priced out, not yet settled: (the sequence length each continues, its tokens, their
        log probs)."""

    def observe(self, log_probs: Sequence[float], accepted: int) -> None:
        """A draft's chances (its tokens' log probs) and how many of its tokens were right."""
        self.expected += sum(survival(log_probs))
        self.accepted += accepted

    def priced_out(self, at: int, draft: Sequence[int], log_probs: Sequence[float]) -> None:
        """A draft continuing the first `at` tokens of the sequence, not verified: `settle` scores it."""
        if draft:
            self.pending.append((at, list(draft), list(log_probs)))

    def settle(self, sequence: Sequence[int]) -> None:
        """Score each pending draft the sequence has gone past, or left at a token the draft got wrong,
        as verification would have (its right tokens up to the first wrong one)."""
        waiting = []
        for at, draft, log_probs in self.pending:
            right = draft_outcome(sequence[at: at + len(draft)], draft)
            if right is None:
                waiting.append((at, draft, log_probs))
            else:
                self.observe(log_probs, right)
        self.pending = waiting

    @property
    def factor(self) -> float:
        ratio = (self.accepted + self.prior) / (self.expected + self.prior)
        return min(max(ratio, 1.0 / self.bound), self.bound)
