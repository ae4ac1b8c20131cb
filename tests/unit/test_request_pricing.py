"""RequestPricing.cut: a draft is cut to what was asked within the request's budget, a lookup's (its
tokens carry their chances) to what is worth verifying at the measured cost, wherever its end falls."""

from __future__ import annotations

import math

from minions.speculation.drafters import Proposal
from minions.speculation.pricing.draft_length import FixedLength
from minions.speculation.pricing.length_stats import SharedLengthStats
from minions.speculation.pricing.request_pricing import RequestPricing


def pricing() -> RequestPricing:
    """A request asking its lookups for 16 tokens, on an LLM measured at one load: a plain step 10 ms,
    each draft token half a step more. A draft whose every token is right with 0.9 is cheapest per
    emitted token verified 3 long (t(3) / E(3) = 25 ms / 3.44 against 20 / 2.71 at 2 and 30 / 4.10 at 4)."""
    stats = SharedLengthStats()
    for _ in range(20):
        for s in range(17):
            stats.verify.observe(1, s, 0.010 * (1 + 0.5 * s))
    return RequestPricing(stats, FixedLength(4, stats), max_draft_tokens=16, asked_whole=True, load=lambda: 1)


def lookup_draft(n: int, chance: float = 0.9) -> Proposal:
    return Proposal(draft=list(range(100, 100 + n)), log_probs=[math.log(chance)] * n)


def test_a_lookup_draft_asked_whole_is_cut_to_its_worth():
    proposal = lookup_draft(16)
    pricing().cut(proposal, batch=1, at=50, asked=4, room=100)
    assert proposal.draft == list(range(100, 103))
    assert proposal.priced_out == 13


def test_a_lookup_draft_past_the_budget_is_still_cut_to_its_worth():
    proposal = lookup_draft(16)
    pricing().cut(proposal, batch=1, at=50, asked=16, room=5)
    assert proposal.draft == list(range(100, 103)), "cut to the 5 tokens left, then to the 3 worth verifying"
    assert len(proposal.log_probs) == 3


def test_a_draft_without_chances_is_verified_as_asked_within_the_budget():
    proposal = Proposal(draft=list(range(100, 116)))
    pricing().cut(proposal, batch=1, at=50, asked=4, room=100)
    assert proposal.draft == [100, 101, 102, 103]
    proposal = Proposal(draft=list(range(100, 116)))
    pricing().cut(proposal, batch=1, at=50, asked=4, room=2)
    assert proposal.draft == [100, 101]
