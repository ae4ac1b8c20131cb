"""One request's drafts priced by their own chances (`RequestPricing`): how many tokens to ask its
lookups for, how many of a draft to verify at this load, and whether a lookup's draft beats the vote's
model SSMs'. The length policy (draft_length.py) decides whether to draft at all; this decides what a
draft at hand is worth, by its tokens' chances (worth.py) and the request's calibration of them.

Worked example, a request drafting with the lookups on an adaptive length whose policy wants k = 4,
`max_draft_tokens` 16: the lookups are asked for 16 tokens (`asked`). A copy of 16 tokens at 0.95
each is verified whole where t(b, 16) / E(16) beats a plain step; a match whose chances fall to 0.2
by its third token keeps its first two (worth.py's example). Found by a probe, the draft also pays
the plain stream's restart (`stops_stream`), and is verified only while it still beats a plain step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from minions.speculation.drafters import Proposal
from minions.speculation.pricing.draft_length import DraftLengthSelector, FixedLength
from minions.speculation.pricing.length_stats import SharedLengthStats
from minions.speculation.pricing.worth import ChanceCalibration, cheapest_verification


class RequestPricing:
    """A request's pricing of its drafts: the server's cost table and length statistics, the request's
    length policy, and how its drafts fared against their chances (`calibration`)."""

    def __init__(self, stats: SharedLengthStats, length: DraftLengthSelector | FixedLength, *,
                 max_draft_tokens: int, asked_whole: bool, load: Callable[[], int]) -> None:
        self.stats, self.length, self.load = stats, length, load
        self.max_draft_tokens = max_draft_tokens
        self.asked_whole = asked_whole
        """Every SSM of the request's drafter sends its tokens' chances: drafts are asked whole (`asked`)."""
        self.calibration = ChanceCalibration()

    def asked(self, k: int) -> int:
        """How many tokens to ask the drafters for when the length policy wants k. Drafts whose every
        token carries its chance are asked whole (`max_draft_tokens`) and cut by those chances (`cut`):
        the policy's k is an average over the request's drafts, and a long copy's draft is worth more of
        its tokens than the average one. The policy still decides whether to draft at all (k = 0)."""
        return max(k, self.max_draft_tokens) if k > 0 and self.asked_whole else k

    def cheapest(self, log_probs: Sequence[float], batch: int,
                 stops_stream: bool = False) -> tuple[int, float | None]:
        """The cheapest verification of a draft whose tokens carry these log chances, at this load, by
        this request's calibration (worth.py, cheapest_verification); `stops_stream`: a probe's draft,
        whose verification also costs the plain stream's restart (VerifyCostTable.restart_extra)."""
        verify = self.stats.verify
        costs = verify.within_reach(batch, range(len(log_probs) + 1))
        overhead = verify.restart_extra(batch, costs[0]) if stops_stream else 0.0
        return cheapest_verification(log_probs, costs, self.calibration.factor, overhead)

    def cut(self, proposal: Proposal, batch: int, at: int, *, asked: int | None = None, room: int | None = None,
            stops_stream: bool = False) -> None:
        """Cut a draft to what is worth verifying. First to the `asked` tokens within the `room` left in
        the request's budget (None: as drafted), except that a draft carrying its tokens' chances (a
        lookup's, asked whole) keeps up to `max_draft_tokens`; then such a draft to the length worth
        verifying at this load (`cheapest`). A draft priced out is left to the calibration, which scores
        it against the text that follows the sequence's first `at` tokens."""
        if asked is not None:
            whole = asked if proposal.log_probs is None else max(asked, self.max_draft_tokens)
            proposal.cut(whole if room is None else min(whole, room))
        chances = proposal.log_probs
        if chances is not None and 0 < len(proposal.draft) == len(chances):
            worth = self.cheapest(chances, batch, stops_stream)[0]
            if worth == 0:
                self.calibration.priced_out(at, proposal.draft, chances)
            proposal.priced_out += len(proposal.draft) - worth
            proposal.cut(worth)

    def instead(self, log_probs: list[float], k: int) -> int:
        """How many tokens of a lookup draft whose tokens carry these log chances to verify in place of
        k tokens of the vote's model SSMs (DraftRound.instead): its cheapest verification, where that
        costs less per emitted token than the length policy expects of the models' k, drafting
        included; 0: ask the models. Say the lookup's 6 tokens verify at 7.4 ms an emitted token and
        the models' 4 are expected to cost 8.0 (J(4), their drafting included): the lookup's 6 go."""
        batch = self.load()
        n, per_token = self.cheapest(log_probs, batch)
        if n == 0 or per_token is None or not isinstance(self.length, DraftLengthSelector):
            return 0
        models = self.length.time_per_token(k, batch)
        return n if models is None or per_token < models else 0
