"""benchmarks.bench_draft_choice's rules on a made-up cost table: the served cut verifies the draft
length with the least expected time per token, the net-gain cut the one with the most tokens net of
their time at a plain step's rate, which goes further on the same chances; the oracle verifies what
is accepted."""

from __future__ import annotations

from benchmarks.bench_draft_choice import Candidate, CostTable, NetGain, ServedCut, oracle

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
