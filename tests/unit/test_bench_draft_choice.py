"""benchmarks.bench_draft_choice's rules on a made-up cost table: the served cut verifies the draft
length with the least expected time per token, the net-gain cut the one with the most tokens net of
their time at a plain step's rate, which goes further on the same chances; the oracle verifies what
is accepted; the agreement classes and the cut that learns from them; the hindsight bound."""

from __future__ import annotations

from benchmarks.bench_draft_choice import (Candidate, CostTable, HindsightChances, NetGain, ServedCut,
                                          ServedCutByAgreement, agreement_classes, oracle)

COSTS = CostTable({k: [0.010 * (1 + 0.5 * k)] for k in (0, 1, 2, 4, 8, 16)})
"""A plain step 10 ms, each draft token half a step more."""
DRAFT = list(range(100, 116))
CHANCES = [0.9 ** (i + 1) for i in range(16)]
"""A 16-token draft whose every next token is right with 0.9."""


def test_the_served_cut_stops_where_time_per_token_is_least_and_net_gain_goes_further():
    truth = DRAFT + [7]
    served, _ = ServedCut()({"a": Candidate(DRAFT, CHANCES)}, truth, COSTS)
    net, _ = NetGain()({"a": Candidate(DRAFT, CHANCES)}, truth, COSTS)
    assert 0 < len(served) < len(net) <= len(DRAFT)


def test_nothing_is_verified_where_no_length_pays():
    dear = CostTable({k: [0.010 * (1 + 2.0 * k)] for k in (0, 1, 16)})
    for rule in (ServedCut(), NetGain()):
        assert rule({"a": Candidate(DRAFT, CHANCES)}, DRAFT, dear) == ([], 0)


def test_the_oracle_verifies_exactly_the_accepted_prefix_of_the_best_draft():
    truth = DRAFT[:5] + [1, 2, 3]
    candidates = {"a": Candidate(DRAFT[:3], CHANCES[:3]), "b": Candidate(DRAFT, CHANCES)}
    assert oracle(candidates, truth, COSTS) == (DRAFT[:5], 5)


def test_positions_are_classed_by_what_the_other_draft_says_there():
    candidates = {"a": Candidate([1, 2, 3, 4, 5], CHANCES[:5]), "b": Candidate([1, 2, 9], CHANCES[:3])}
    classes = agreement_classes(candidates)
    assert [c for c, _ in classes["a"]] == ["agree", "agree", "differ", "alone", "alone"]
    assert [c for c, _ in classes["b"]] == ["agree", "agree", "differ"]
    assert [b for _, b in agreement_classes({"a": Candidate(DRAFT, CHANCES)})["a"]] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


def test_agreeing_drafts_that_keep_being_right_are_verified_further():
    """Two lookups drafting the same 16 tokens, right every time, with chances that fall fast: the
    plain served cut keeps verifying a few, the agreement cut learns that agreeing positions beat
    their chances and verifies more of them."""
    fast_falling = [0.6 ** (i + 1) for i in range(16)]
    truth = DRAFT + [7]
    plain, learnt = ServedCut(), ServedCutByAgreement(prior=1.0)
    for _ in range(20):
        both = {"a": Candidate(DRAFT, fast_falling), "b": Candidate(DRAFT, fast_falling)}
        served, _ = plain(both, truth, COSTS)
        agreed, accepted = learnt(both, truth, COSTS)
    assert len(agreed) > len(served)
    assert accepted == len(agreed)
    assert "| agree | 0-3 |" in learnt.table()


def test_the_hindsight_bound_prices_positions_by_how_often_their_bin_was_right():
    """Chances of 0.6 that fall fast, on a draft that is always right: the served cut verifies a few
    tokens; the bound, once its first pass has counted every position right, verifies all of them. A
    draft always wrong at its first token from its second pass on is not verified at all."""
    fast_falling = [0.6 ** (i + 1) for i in range(16)]
    truth = DRAFT + [7]
    bound = HindsightChances(by_agreement=False)
    learning, _ = bound({"a": Candidate(DRAFT, fast_falling)}, truth, COSTS)
    assert learning == ServedCut()({"a": Candidate(DRAFT, fast_falling)}, truth, COSTS)[0]
    bound.learning = False
    assert bound({"a": Candidate(DRAFT, fast_falling)}, truth, COSTS) == (DRAFT, len(DRAFT))
    wrong = HindsightChances()
    high = [0.99] * 16
    wrong({"a": Candidate(DRAFT, high)}, [7], COSTS)
    wrong.learning = False
    assert wrong({"a": Candidate(DRAFT, high)}, [7], COSTS) == ([], 0)
