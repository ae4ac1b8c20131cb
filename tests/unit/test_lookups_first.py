"""speculation.vote_drafter: a vote of lookups and model SSMs asks the lookups first, whole, and verifies a
lookup draft in the models' place where the loop prices it cheaper (`DraftRound.instead`); otherwise the
models are asked and the lookups' drafts join the vote; lookups that lost rest. Engines are stand-ins
that answer at once with fixed drafts (the loop-level test with real engines is in test_drafting.py)."""

from __future__ import annotations

import asyncio
import math

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.speculation.drafters import DraftRound
from minions.speculation.health import SsmHealth
from minions.speculation.vote_drafter import VoteDrafter
from minions.speculation.watch import DraftRest, ProbeSchedule
from minions.speculation.weights import SsmWeights

MODEL, LOOKUP = "model", "lookup"
COPY = list(range(100, 116))
"""The lookup's whole draft: 16 tokens, each 0.9 likely given the ones before."""


class Drafts:
    """Engines that answer each call with a fixed draft (the lookup's with its tokens' log chances)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        """(model, tokens asked for) of each call, in order."""
        self.sampled: list[str] = []
        """The models asked for a sampled draft (with its logits)."""

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        self.asked.append((model, request.request_output_len))
        if request.return_generation_logits:
            self.sampled.append(model)
        if model == LOOKUP:
            draft = COPY[: request.request_output_len]
            return EngineResult(draft, log_probs=[math.log(0.9)] * len(draft) if request.return_log_probs else None)
        return EngineResult([7] * request.request_output_len)


def drafter(rest: DraftRest | None = None, sampled: bool = False, ahead=lambda: True) -> VoteDrafter:
    weights = SsmWeights((MODEL, LOOKUP))
    weights.update({MODEL: 1.0, LOOKUP: 0.0})  # the model dominates, as ssm_q4 does in deploy.torch.yaml
    return VoteDrafter((MODEL, LOOKUP), SsmHealth(), weights, deadline_s=5.0, explore_every=8, sampled=sampled,
                       rest=rest, ahead=ahead)


def round_(sequence: list[int], instead, index: int = 1, k: int = 4) -> DraftRound:
    return DraftRound("req", sequence, k, index=index, confident=frozenset({LOOKUP}), whole=16, instead=instead)


def test_a_lookup_draft_priced_cheaper_is_the_round_s_draft_whole_and_the_model_is_not_asked():
    engines = Drafts()
    offered: list[tuple[int, int]] = []

    def instead(log_probs: list[float], k: int) -> int:
        offered.append((len(log_probs), k))
        return 12

    proposal = asyncio.run(drafter().propose(engines, round_([1, 2, 3], instead)))
    assert engines.asked == [(LOOKUP, 16)], "the lookup asked whole, the model not at all"
    assert offered == [(16, 4)], "priced against the models' k"
    assert proposal.draft == COPY and proposal.chosen == LOOKUP and len(proposal.log_probs) == 16
    assert proposal.drafts == {LOOKUP: COPY}, "scored as a ballot"


def test_a_lookup_draft_priced_dearer_leaves_the_round_to_the_model_and_both_are_scored():
    engines = Drafts()
    proposal = asyncio.run(drafter().propose(engines, round_([1, 2, 3], lambda log_probs, k: 0)))
    assert engines.asked == [(LOOKUP, 16), (MODEL, 4)]
    assert proposal.draft == [7] * 4 and proposal.chosen == MODEL
    assert proposal.drafts == {LOOKUP: COPY, MODEL: [7] * 4}, "both drafts are scored"


def test_without_a_dominant_ssm_a_lookup_draft_priced_dearer_joins_the_vote():
    engines = Drafts()
    even = VoteDrafter((MODEL, LOOKUP), SsmHealth(), SsmWeights((MODEL, LOOKUP)), deadline_s=5.0, explore_every=8,
                       sampled=False)
    proposal = asyncio.run(even.propose(engines, round_([1, 2, 3], lambda log_probs, k: 0)))
    assert engines.asked == [(LOOKUP, 16), (MODEL, 4)]
    assert set(proposal.drafts) == {LOOKUP, MODEL}, "both voted"
    assert proposal.draft == proposal.drafts[proposal.chosen]
    assert (proposal.log_probs is not None) == (proposal.chosen == LOOKUP), "a lookup's path carries its chances"


def test_a_model_drafting_alone_after_the_lookups_lost_samples_as_it_would_without_them():
    """A sampled request's lone drafter samples its draft (verified by min(1, p/q)); the lookups'
    greedy drafts are then scored beside it, not voted with it."""
    engines = Drafts()
    proposal = asyncio.run(drafter(sampled=True).propose(engines, round_([1, 2, 3], lambda log_probs, k: 0)))
    assert engines.sampled == [MODEL] and proposal.chosen == MODEL
    assert proposal.draft == [7] * 4 and proposal.drafts == {LOOKUP: COPY, MODEL: [7] * 4}


def test_without_pricing_every_ssm_is_asked_the_same_k_as_before():
    """A request with a fixed draft length has no `instead`: the vote asks as it always did."""
    engines = Drafts()
    asyncio.run(drafter().propose(engines, round_([1, 2, 3], None, index=8)))  # an exploring round: both asked
    assert sorted(engines.asked) == [(LOOKUP, 4), (MODEL, 4)]
    engines.asked.clear()
    asyncio.run(drafter().propose(engines, round_([1, 2, 3], None, index=9)))
    assert engines.asked == [(MODEL, 4)], "the dominant model alone between exploring rounds"


def test_lookups_that_lost_rest_and_the_model_drafts_alone_meanwhile():
    engines = Drafts()
    vote = drafter(DraftRest(ProbeSchedule(min_gap=4, max_gap=64)))
    lost = lambda log_probs, k: 0  # noqa: E731
    sequence = [1, 2, 3]
    asked_lookup = []
    for i in range(1, 10):
        engines.asked.clear()
        asyncio.run(vote.propose(engines, round_(sequence, lost, index=i)))
        asked_lookup.append((LOOKUP, 16) in engines.asked)  # first, whole (round 8 also explores it at k)
        assert (MODEL, 4) in engines.asked
        sequence = sequence + [5]
    assert asked_lookup == [True, False, False, False, True, False, False, False, False], (
        "asked, then 4 tokens' rest, asked, then a doubled rest")
    won = lambda log_probs, k: 8  # noqa: E731
    for _ in range(4):
        sequence = sequence + [5]
    engines.asked.clear()
    assert asyncio.run(vote.propose(engines, round_(sequence, won, index=11))).chosen == LOOKUP
    engines.asked.clear()
    asyncio.run(vote.propose(engines, round_(sequence + [5], won, index=12)))
    assert engines.asked == [(LOOKUP, 16)], "a lookup that won is asked first again at the next round"


def test_under_load_the_model_drafts_as_it_did_without_asking_the_lookups_first():
    """Above the load the vote is given (`ahead`: services, probe_max_load) a lookup's ask would delay
    every round's model call: the vote asks as it always did."""
    engines = Drafts()
    proposal = asyncio.run(drafter(ahead=lambda: False).propose(engines, round_([1, 2, 3], lambda log_probs, k: 16)))
    assert engines.asked == [(MODEL, 4)] and proposal.chosen == MODEL
