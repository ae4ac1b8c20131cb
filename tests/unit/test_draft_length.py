"""minions.speculation.pricing.draft_length: the adaptive speculation length, driven by a synthetic cost model.

The synthetic world: verification costs t(b, s) = base(b) + slope * s, drafting costs d per token, and
each draft position is accepted with probability a (so E(s) is known in closed form). The best s is
computed from that model by brute force, never written down.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from minions.decoding.tokens import draft_outcome
from minions.settings import DEFAULTS
from minions.speculation.pricing.draft_length import DraftLengthSelector
from minions.engines.draft_confidence import token_log_probs
from minions.speculation.pricing.worth import ChanceCalibration, cheapest_verification, worth_verifying
from minions.speculation.pricing.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.pricing.verify_costs import VerifyCostTable, load_bucket

DEFAULT_CANDIDATES = DEFAULTS.draft_length_candidates


class World:
    def __init__(self, acceptance: float, draft_per_token: float = 0.01, slope: float = 0.004, seed: int = 0):
        self.acceptance = acceptance
        self.draft_per_token = draft_per_token
        self.slope = slope
        self.rng = np.random.default_rng(seed)

    def verify_seconds(self, batch: int, s: int) -> float:
        return (0.06 + 0.01 * batch) + self.slope * s * batch

    def draft_seconds(self, s: int) -> float:
        return s * self.draft_per_token

    def true_cost(self, batch: int, s: int) -> float:
        expected = sum(self.acceptance**i for i in range(s + 1))
        return (self.draft_seconds(s) + self.verify_seconds(batch, s)) / expected

    def best(self, batch: int, candidates=DEFAULT_CANDIDATES) -> int:
        return min(candidates, key=lambda s: self.true_cost(batch, s))

    def run(self, selector: DraftLengthSelector, batch: int, rounds: int) -> list[int]:
        chosen = []
        for _ in range(rounds):
            s = selector.choose(batch)
            accepted = 0
            while accepted < s and self.rng.random() < self.acceptance:
                accepted += 1
            noise = self.rng.normal(1.0, 0.05)
            selector.observe(batch, s, accepted, self.draft_seconds(s) * noise, self.verify_seconds(batch, s) * noise)
            chosen.append(s)
        return chosen


@pytest.mark.parametrize("acceptance,batch", [(0.9, 1), (0.6, 1), (0.9, 8), (0.75, 4)])
def test_converges_to_the_best_length_of_the_cost_model(acceptance, batch):
    world = World(acceptance, seed=int(acceptance * 100) + batch)
    selector = DraftLengthSelector(SharedLengthStats(), max_length=8)
    trace = world.run(selector, batch, 300)
    settled = Counter(trace[-100:]).most_common(1)[0][0]
    best = world.best(batch)
    # The settled choice is the optimum, or a length whose true cost is within the margin of it.
    assert world.true_cost(batch, settled) <= world.true_cost(batch, best) * 1.05, (settled, best, Counter(trace[-100:]))


def test_chooses_no_speculation_when_drafting_is_worthless():
    world = World(acceptance=0.0, seed=1)
    selector = DraftLengthSelector(SharedLengthStats(), max_length=8)
    trace = world.run(selector, 1, 120)
    assert world.best(1) == 0
    assert Counter(trace[-60:])[0] >= 60 * (1 - 1 / selector.policy.explore_every) - 1


def test_on_a_fresh_server_a_length_that_does_not_pay_is_left_for_plain_decoding_not_a_shorter_draft():
    """Nothing but the initial length measured: below it t(b, s) is that length's level carried down, so
    plain decoding looks as dear as a verification and a one-token draft cheaper than both (the first
    request on a fresh Qwen2.5-Coder server verified four 1-token drafts, an LLM call each). In a
    compute-bound world where drafting does not pay, the first move is to 0."""
    world = World(acceptance=0.25, slope=0.04, seed=4)
    selector = DraftLengthSelector(SharedLengthStats(), max_length=8)
    assert world.best(1) == 0
    trace = world.run(selector, 1, 12)
    moved = next(s for s in trace if s != trace[0])
    assert moved == 0, trace


class FixedCostWorld(World):
    """Where a draft of one token is the dearest per token: every verification pays a fixed cost over a
    plain step, and every draft call one over its tokens (SmolLM2 fp32 on torch, one thread, in process:
    a plain step 55 ms, verifications of 1, 4 and 16 tokens 83, 88 and 126 ms; `ssm_q4` 13 ms a token
    after a catch-up of the tokens decoded since its last draft)."""

    def __init__(self, acceptance: float, seed: int = 0):
        super().__init__(acceptance, draft_per_token=0.013, seed=seed)

    def verify_seconds(self, batch: int, s: int) -> float:
        return 0.055 if s == 0 else 0.083 + 0.0027 * s

    def draft_seconds(self, s: int) -> float:
        return 0.02 + self.draft_per_token * s if s else 0.0


def test_plain_decoding_is_left_where_only_drafts_longer_than_one_token_pay():
    """Seen served on deploy.torch.yaml (bench_load's `single:ssm_q4`, pipeline off): a request at
    s = 0 explored only s = 1, whose draft and verification cost more than a plain step for at most
    one token more, and the line through t(0) and t(1) priced 16 tokens at 634 ms (126 measured in
    process): every request stayed plain. Exploring from 0 also tries the starting length, which
    measures what a longer draft costs."""
    world = FixedCostWorld(acceptance=0.99, seed=3)
    assert world.true_cost(1, 1) > world.true_cost(1, 0) > 2 * world.true_cost(1, world.best(1))
    shared = SharedLengthStats()
    for _ in range(200):  # a server that has decoded plainly, and verified one 1-token draft
        shared.observe(1, False, 0, 0, None, world.verify_seconds(1, 0))
    for _ in range(3):
        shared.observe(1, False, 1, 1, world.draft_seconds(1), world.verify_seconds(1, 1))
    selector = DraftLengthSelector(shared, max_length=16)
    selector.current = 0
    trace = world.run(selector, 1, 120)
    settled = Counter(trace[-40:]).most_common(1)[0][0]
    assert world.true_cost(1, settled) < 0.6 * world.true_cost(1, 0), (settled, trace)


def test_a_plain_pass_that_held_a_waves_prompts_is_no_plain_step():
    """Eight requests arrive at once (deploy.torch.yaml at 8 streams): one's plain call goes out while
    the other seven report their prompts, which the LLM computes in the same pass (2.6 s); by its
    answer they have reported short rounds. Read at the answer, the batch looked plain and t(8, 0)
    took 2.6 s, so that drafting looked free and every request crept up from s = 0. Read as the pass
    its call went into, it held prefills: it is left out, and plain steps set t(8, 0)."""
    def wave(stats: SharedLengthStats, request_id: str | None) -> None:
        stats.report("a", 0)
        for other in "bcdefgh":
            stats.report(other, 80)  # their prompts, in a's pass
        for other in "bcdefgh":
            stats.report(other, 0)  # their next rounds, sent before a's answer
        stats.observe(8, False, 0, 0, None, 2.6, request_id=request_id)

    at_the_answer = SharedLengthStats()
    wave(at_the_answer, None)
    assert at_the_answer.verify.estimate(8, 0) == pytest.approx(2.6), "the fault this guards against"
    stats = SharedLengthStats()
    wave(stats, "a")
    stats.answered("a")
    assert 0 not in stats.verify.measured_lengths(8)
    stats.report("a", 0)
    stats.observe(8, False, 0, 0, None, 0.22, request_id="a")
    assert stats.verify.estimate(8, 0) == pytest.approx(0.22)


def test_adapts_per_request_when_acceptance_collapses_and_recovers():
    shared = SharedLengthStats()
    selector = DraftLengthSelector(shared, max_length=8)
    good, bad = World(0.9, seed=2), World(0.0, seed=3)
    assert Counter(good.run(selector, 1, 150)[-50:]).most_common(1)[0][0] >= 4
    assert Counter(bad.run(selector, 1, 100)[-40:]).most_common(1)[0][0] == 0
    assert Counter(good.run(selector, 1, 200)[-50:]).most_common(1)[0][0] >= 4


def test_a_request_whose_drafts_fail_leaves_speculation_soon_after_others_succeeded():
    """The server has learnt that drafts pass (copy-heavy requests); a chat request whose drafts are
    all rejected must reach s = 0 on its own evidence within a few rounds, not ride the server's prior."""
    shared = SharedLengthStats()
    for seed in range(4):
        World(1.0, draft_per_token=0.0005, seed=seed).run(DraftLengthSelector(shared, 16), 1, 40)
    chat = World(0.0, draft_per_token=0.0005, seed=9).run(DraftLengthSelector(shared, 16), 1, 12)
    assert chat[0] > 0 and 0 in chat[:8], chat


def test_does_not_oscillate_on_a_steady_workload():
    world = World(0.8, seed=4)
    selector = DraftLengthSelector(SharedLengthStats(), max_length=8)
    world.run(selector, 2, 100)
    explore = selector.policy.explore_every
    before = selector.rounds
    steady = world.run(selector, 2, 200)
    steady = [s for i, s in enumerate(steady, start=before + 1) if i % explore]
    changes = sum(a != b for a, b in zip(steady, steady[1:]))
    assert changes <= 4, steady


def test_one_request_learns_from_the_servers_history():
    shared = SharedLengthStats()
    world = World(0.0, seed=5)
    world.run(DraftLengthSelector(shared, 8), 1, 100)
    fresh = DraftLengthSelector(shared, 8)
    assert fresh.expected_tokens(4) < 1.2, "the prior for a new request is the server's acceptance"
    assert world.run(fresh, 1, 10)[-5:].count(0) >= 4


def test_a_new_request_prices_drafting_at_the_servers_measured_cost():
    """Its own first draft pays the SSMs' prefill and is not measured; taken as free, drafting would
    make the longest draft look best for the rounds a request holds its first choice."""
    world = World(0.9, draft_per_token=0.05, seed=8)
    shared = SharedLengthStats()
    world.run(DraftLengthSelector(shared, 8), 1, 100)
    fresh = DraftLengthSelector(shared, 8)
    assert shared.draft_estimate(1, fresh.pipelined, fresh.drafters) == pytest.approx(0.05, rel=0.1)
    first = fresh.choose(1)
    assert world.true_cost(1, first) <= world.true_cost(1, world.best(1)) * 1.05, (first, world.best(1))
    assert world.true_cost(1, 8) > world.true_cost(1, world.best(1)) * 1.2, "free drafting's choice must cost"


def test_positions_drafts_seldom_reach_are_taken_as_accepted_like_the_one_before():
    shared = SharedLengthStats()
    for _ in range(200):
        shared.acceptance.observe(8, 8)  # every 8-token draft fully accepted
    for _ in range(2):
        shared.acceptance.observe(16, 16)  # and the two 16-token ones too
    rates = shared.global_rates(20)
    assert min(rates) > 0.95, rates  # pulled towards 0.5 instead, positions 9-16 read 0.83
    assert rates[19] == pytest.approx(rates[15]), "unmeasured positions: the last measured rate"


def test_a_length_seen_once_is_pulled_towards_the_line_of_the_well_measured_ones():
    table = VerifyCostTable()
    for _ in range(50):
        table.observe(16, 0, 0.30)
        table.observe(16, 8, 0.70)
    table.observe(16, 2, 0.05)  # one verification while the LLM happened to be idle
    assert 0.30 < table.estimate(16, 2) < 0.40  # the line says 0.40; taken as it is, s = 2 would look best
    assert table.estimate(16, 8) == pytest.approx(0.70, abs=0.01)


def test_a_slow_first_verification_that_prices_every_draft_out_is_forgotten_and_measured_again():
    """One slow verification at one stream (80 ms for 8 tokens, a plain step 6 ms) cuts drafts whose
    every token is 90% likely to nothing; nothing verifies again, so only forgetting it brings drafts
    back: after `verify_memory_rounds` plain rounds the draft is verified, and its new measure is
    taken as it is. A length measured again within that memory is kept."""
    stats = SharedLengthStats()
    stats.verify.plain_streams = True
    chances = [math.log(0.9)] * 16

    def worth() -> int:
        return worth_verifying(chances, stats.verify.within_reach(1, range(17)))

    for _ in range(50):
        stats.observe(1, True, 0, 0, None, 0.006)
    stats.observe(1, True, 8, 0, 0.0, 0.080)
    assert worth() == 0
    for _ in range(stats.policy.verify_memory_rounds):
        stats.observe(1, True, 0, 0, None, 0.006)
    assert worth() == 0, "still within memory"
    stats.observe(1, True, 0, 0, None, 0.006)
    assert worth() > 0, "forgotten: the next draft is verified and measures the length again"
    stats.observe(1, True, 8, 7, 0.0, 0.024)
    assert stats.verify.estimate(1, 8) == pytest.approx(0.024), "the new measure taken as it is"
    for _ in range(3):
        for _ in range(stats.policy.verify_memory_rounds // 2):
            stats.observe(1, True, 0, 0, None, 0.006)
        stats.observe(1, True, 8, 8, 0.0, 0.024)
    assert stats.verify.measured_lengths(1)[8] == 4, "measured every half memory: never forgotten"


def test_moves_at_most_one_length_beyond_the_longest_measured_at_its_load():
    """Longer drafts look ever better by extrapolation here; the selector climbs one candidate at a
    time, measuring each, and still reaches the longest."""
    world = World(0.99, draft_per_token=0.002, seed=9)
    candidates = (0, 1, 2, 3, 4, 6, 8, 12, 16)
    shared = SharedLengthStats(LengthPolicy(candidates=candidates))
    selector = DraftLengthSelector(shared, max_length=16)
    longest_measured = selector.current  # nothing measured yet: one step beyond the current length
    trace = []
    for _ in range(60):
        s = world.run(selector, 1, 1)[0]
        trace.append(s)
        beyond = [c for c in candidates if c > longest_measured]
        assert s <= (beyond[0] if beyond else candidates[-1]), (s, longest_measured, trace)
        longest_measured = max(longest_measured, s)
    assert Counter(trace[-20:]).most_common(1)[0][0] == world.best(1, candidates) == 16


def test_does_not_step_beyond_the_measured_lengths_once_the_cost_stops_falling_towards_them():
    """Verification turned convex at 8 (the LLM's queue): the line through the measured lengths
    extends to an optimistic t(12), but 8 is no cheaper than 6, so the bracket is not widened."""
    candidates = (0, 1, 2, 3, 4, 6, 8, 12, 16)
    shared = SharedLengthStats(LengthPolicy(candidates=candidates))
    for _ in range(50):
        for s, seconds in ((0, 0.30), (4, 0.40), (6, 0.45), (8, 0.60)):
            shared.verify.observe(16, s, seconds)
        shared.acceptance.observe(16, 16)
    selector = DraftLengthSelector(shared, max_length=16)
    assert selector.time_per_token(12, 16) < 0.9 * selector.time_per_token(6, 16), "extrapolation favours 12"
    assert selector.choose(16) == 6


def test_max_length_bounds_the_candidates():
    selector = DraftLengthSelector(SharedLengthStats(LengthPolicy(initial=8)), max_length=3)
    assert selector.candidates == (0, 1, 2, 3) and selector.current == 3


def test_verify_cost_table_interpolates_and_borrows_the_nearest_load():
    table = VerifyCostTable()
    assert table.estimate(1, 4) is None
    table.observe(1, 2, 0.08)
    table.observe(1, 8, 0.14)
    assert table.estimate(1, 4) == pytest.approx(0.10)
    assert table.estimate(2, 8) == pytest.approx(0.14), "no load-2 data: the nearest bucket's"
    assert [load_bucket(b) for b in (1, 2, 3, 4, 5, 16, 17)] == [1, 2, 4, 4, 8, 16, 32]


def test_verify_cost_table_extends_the_measured_trend_beyond_the_measured_lengths():
    table = VerifyCostTable()
    table.observe(1, 2, 0.08)
    table.observe(1, 8, 0.14)
    assert table.estimate(1, 0) == pytest.approx(0.06) and table.estimate(1, 16) == pytest.approx(0.22)
    table.observe(16, 4, 1.0)  # one length measured at load 16: the load-1 curve's shape, at its level
    relative = 0.01 / 0.11  # load 1: +0.01 s per token around a mean of 0.11 s
    assert table.estimate(16, 16) == pytest.approx(1.0 * (1 + relative * 12))
    assert table.estimate(16, 4) == pytest.approx(1.0)


def test_streamed_plain_steps_do_not_bend_the_verifications_line():
    """A streaming LLM's plain step costs no call: its thousands of samples drawn into the line with a
    few short verifications made each drafted token look as dear as the call (measured on Q4_1 at one
    stream: 6 ms a token by the line, 3 by verifications of 9 and 13 tokens) and priced long drafts out."""
    verifications = ((1, 0.019), (3, 0.027), (4, 0.031))
    streaming, calls_only, one_line = VerifyCostTable(plain_streams=True), VerifyCostTable(), VerifyCostTable()
    for _ in range(1000):
        streaming.observe(1, 0, 0.0073)
        one_line.observe(1, 0, 0.0073)
    for _ in range(3):
        for table in (streaming, calls_only, one_line):
            for s, seconds in verifications:
                table.observe(1, s, seconds)
    lengths = [1, 4, 8, 16]
    assert streaming.estimates(1, lengths) == pytest.approx(calls_only.estimates(1, lengths))
    assert streaming.estimate(1, 0) == pytest.approx(0.0073)
    assert one_line.estimate(1, 16) > 1.2 * streaming.estimate(1, 16), "a non-streaming LLM's plain step is on the line"


def test_a_draft_priced_by_its_chances_may_go_twice_as_far_as_the_longest_measured_length():
    """A fresh server that had verified 3 and 4 tokens once each (as measured, the 4 cold) drew t(16)
    at 101 ms where 55-60 is measured: a copy's draft (as its chances were then) was cut to 2 tokens,
    below a probe's minimum, by every probe of a run, and nothing longer was ever measured. Up to
    twice the measured edge costs what the edge costs: the draft is verified to 8, which measures t(8)."""
    table = VerifyCostTable(plain_streams=True)
    for _ in range(1000):
        table.observe(1, 0, 0.0073)
    table.observe(1, 3, 0.0234)
    table.observe(1, 4, 0.0294)
    copy = [math.log(0.844)] + [math.log(0.95)] * 3 + [math.log(0.96)] * 4 + [math.log(0.91)] * 8
    lengths = range(len(copy) + 1)
    assert worth_verifying(copy, table.estimates(1, lengths)) < DEFAULTS.probe.min_draft
    reach = table.within_reach(1, lengths)
    assert worth_verifying(copy, reach) == 8
    assert [reach[s] for s in (5, 8)] == [table.estimate(1, 4)] * 2
    assert reach[16] == pytest.approx(table.estimate(1, 4) + (table.estimate(1, 16) - table.estimate(1, 8)))
    assert all(reach[s] == table.estimate(1, s) for s in range(5)), "measured lengths keep their estimates"
    table.observe(1, 16, 0.058)
    assert table.within_reach(1, lengths) == table.estimates(1, lengths), "16 measured: no length beyond reach"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_crowd_sharing_one_llm_pass_settles_on_the_best_common_length(seed):
    """Eight requests at a time, each a few rounds long (as in the benchmark), verified in one pass
    whose time grows with all their tokens. Keyed on its own length, each request would see the
    others keep the pass cheap, and all would draft 8 (13% slower than the best common length here);
    keyed on the batch's length they find the best common one."""
    batch, acceptance, draft_per_token = 8, 0.9, 0.01
    rng = np.random.default_rng(seed)
    shared = SharedLengthStats()

    def pass_seconds(lengths) -> float:
        return 0.05 + 0.004 * sum(s + 1 for s in lengths)

    def common_cost(s: int) -> float:
        expected = sum(acceptance**i for i in range(s + 1))
        return (s * draft_per_token + pass_seconds([s] * batch)) / expected

    def new_request() -> list:
        return [DraftLengthSelector(shared, max_length=8), int(rng.integers(4, 12))]  # selector, rounds left

    requests = {f"r{i}": new_request() for i in range(batch)}
    settled = Counter()
    for step in range(400):
        lengths = {rid: selector.choose(batch) for rid, (selector, _) in requests.items()}
        for rid, s in lengths.items():
            shared.report(rid, s)  # what the decode loop does before each verification
        verify = pass_seconds(lengths.values())
        for rid, s in lengths.items():
            accepted = 0
            while accepted < s and rng.random() < acceptance:
                accepted += 1
            requests[rid][0].observe(batch, s, accepted, s * draft_per_token, verify)
            requests[rid][1] -= 1
            if requests[rid][1] == 0:
                shared.forget(rid)
                requests[f"{rid}+"] = new_request()
                del requests[rid]
        if step >= 200:
            settled.update(lengths.values())
    best = min(DEFAULT_CANDIDATES, key=common_cost)
    mean_cost = sum(common_cost(s) * n for s, n in settled.items()) / sum(settled.values())
    assert mean_cost <= common_cost(best) * 1.05, (best, settled)
    assert common_cost(8) > common_cost(best) * 1.1, "the world must punish the selfish choice"


def test_finished_requests_leave_the_batch_length():
    shared = SharedLengthStats()
    assert shared.batch_length(default=5) == 5
    shared.report("a", 8)
    shared.report("b", 3)
    assert shared.batch_length(default=5) == 6  # round(5.5): banker's rounding to even
    shared.forget("a")
    shared.forget("missing")
    assert shared.batch_length(default=5) == 3


def test_one_rounds_burst_of_slow_drafts_at_high_load_does_not_swing_the_servers_estimates():
    """At 16 streams every request's round feeds the server's averages: weighted per observation,
    they held the last few requests' rounds, all from one moment. Measured: drafting's cost per token
    swung 4x within two rounds of a wave (other requests' SSM prefills held the SSMs) and sent the
    whole batch to s = 0. Weighted per round of the batch, a burst from a third of one round moves
    them little, and the next request still chooses the best length."""
    world = World(0.9, draft_per_token=0.02, slope=0.001, seed=11)
    shared = SharedLengthStats()
    crowd = [DraftLengthSelector(shared, 8) for _ in range(16)]
    for _ in range(20):
        for selector in crowd:
            world.run(selector, 16, 1)
    best = world.best(16)
    assert best >= 4
    for _ in range(5):  # five requests' drafts each waited behind the SSMs' prefill of a new prompt
        shared.observe(16, False, 6, 5, 6 * world.draft_per_token * 5, world.verify_seconds(16, 6))
    assert shared.draft_estimate(16, False) < 1.5 * world.draft_per_token
    fresh = DraftLengthSelector(shared, 8)
    fresh.current = best
    assert world.true_cost(16, fresh.choose(16)) <= world.true_cost(16, best) * 1.05


def test_passes_holding_prefills_longer_than_any_candidate_stay_out_of_the_cost_table():
    """A wave of new requests reports its prompts' prefills (as drafts of the prompt's length), so the
    batch's mean is 70-80 tokens for a few passes. No choice makes such a pass; in the table its few
    points set the slope that extends beyond the measured lengths by leverage alone."""
    shared = SharedLengthStats()
    for s in (0, 4, 8):  # t = 0.3 + 0.05 s at 16 streams, well measured
        for _ in range(20):
            shared.observe(16, False, s, s, 0.1 * s, 0.3 + 0.05 * s)
    for rid in range(16):
        shared.report(str(rid), 80)  # a wave's prefills: cheaper per token than the line
    for _ in range(3):
        shared.observe(16, False, 80, 0, None, 1.0)
    assert set(shared.verify.measured_lengths(16)) == {0, 4, 8}
    assert shared.verify.estimate(16, 12) == pytest.approx(0.3 + 0.05 * 12, rel=0.02)


def _best_by_brute_force(chances: list[float], t) -> int:
    """The k with the least t(k) / E(k), E(k) = 1 + the expected right tokens among the first k, ties
    to the shorter; computed from the chances as given, not as worth_verifying accumulates them."""
    def per_token(k: int) -> float:
        return t(k) / (1 + sum(np.prod(chances[:i + 1]) for i in range(k)))
    return min(range(len(chances) + 1), key=lambda k: (per_token(k), k))


@pytest.mark.parametrize("chances", [[0.95] * 12, [0.3] * 8, [0.9, 0.9, 0.2, 0.2, 0.9], [0.6] * 16, [0.99, 0.05]])
@pytest.mark.parametrize("slope", [0.1, 0.5, 1.0])
def test_a_draft_is_cut_to_the_length_with_the_least_expected_time_per_token(chances, slope):
    """The synthetic world: a verification of k tokens costs 1 + slope * k plain steps, and each draft
    token is right with the drafter's own chance given the ones before it were."""
    def t(k: int) -> float:
        return 1.0 + slope * k
    costs = {k: t(k) for k in range(len(chances) + 1)}
    assert worth_verifying(np.log(chances).tolist(), costs) == _best_by_brute_force(chances, t)


def test_a_confident_draft_is_kept_whole_and_a_doubtful_one_is_not_verified():
    assert worth_verifying([np.log(0.99)] * 8, {k: 1.0 + 0.2 * k for k in range(9)}) == 8
    assert worth_verifying([np.log(0.3)] * 8, {k: 1.0 + 0.5 * k for k in range(9)}) == 0, \
        "1.5 steps for 1.3 tokens expected: plain is cheaper"


def test_while_verification_is_unmeasured_the_draft_is_kept_as_asked():
    assert worth_verifying([np.log(0.1)] * 4, dict.fromkeys(range(5))) == 4
    assert worth_verifying([], {0: 1.0}) == 0


def test_a_request_whose_drafts_beat_their_chances_verifies_more_of_them():
    """Drafts of 4 tokens at 0.5 a token (0.94 expected) accepted whole, time after time: the factor
    climbs to its bound, and a draft the chances alone would not verify is then verified."""
    calibration = ChanceCalibration(prior=8.0, bound=2.0)
    assert calibration.factor == 1.0
    halves = [float(np.log(0.5))] * 4
    costs = {k: 1.0 + 0.6 * k for k in range(5)}
    assert worth_verifying(halves, costs, calibration.factor) == 0
    for _ in range(20):
        calibration.observe(halves, accepted=4)
    assert calibration.factor == 2.0
    assert worth_verifying(halves, costs, calibration.factor) > 0
    for _ in range(200):
        calibration.observe(halves, accepted=0)
    assert calibration.factor == 0.5, "drafts that keep failing: the lower bound"


def test_a_draft_priced_out_is_scored_against_the_text_that_follows_it():
    """A priced-out draft is never verified: it is scored once the sequence has gone past it (its right
    tokens, as verification would have accepted them) or has left it at a wrong token, and not before."""
    calibration = ChanceCalibration(prior=8.0, bound=2.0)
    halves = [float(np.log(0.5))] * 4
    calibration.priced_out(3, [5, 6, 7, 8], halves)
    calibration.priced_out(4, [6, 9, 9], halves[:3])
    calibration.settle([1, 2, 3, 5, 6])
    assert (calibration.accepted, len(calibration.pending)) == (0, 2), "both right so far: both wait"
    calibration.settle([1, 2, 3, 5, 6, 7])
    assert calibration.accepted == 1 and len(calibration.pending) == 1, "the second left at its second token"
    calibration.settle([1, 2, 3, 5, 6, 7, 8])
    assert calibration.accepted == 1 + 4 and not calibration.pending, "the whole first draft was right"
    assert calibration.expected == pytest.approx(0.9375 + 0.875)


def test_a_request_whose_drafts_are_all_priced_out_still_learns_that_it_copies():
    """The trap a verified-only calibration falls into: chances too low to verify anything, so nothing
    is verified and the factor never moves. Priced-out drafts that the text then copied raise it until
    such a draft is verified."""
    calibration = ChanceCalibration(prior=8.0, bound=2.0)
    halves = [float(np.log(0.5))] * 4
    costs = {k: 1.0 + 0.6 * k for k in range(5)}
    text = [1, 2, 3, 4] * 8
    at = 4
    while worth_verifying(halves, costs, calibration.factor) == 0:
        assert at + 4 <= len(text), "still priced out after 7 right drafts"
        calibration.priced_out(at, text[at:at + 4], halves)
        at += 4
        calibration.settle(text[:at])
    assert calibration.factor > 1.0


@pytest.mark.parametrize("seen, right", [([], None), ([5], None), ([5, 6, 7], 3), ([5, 6, 7, 9], 3), ([4], 0),
                                         ([5, 1, 7], 1)])
def test_a_drafts_outcome_is_known_once_the_text_passed_it_or_left_it(seen, right):
    assert draft_outcome(seen, [5, 6, 7]) == right


def first_choices(shared: SharedLengthStats, world: World, requests: int) -> list[int]:
    """Each of `requests` requests' first draft length after its prompt's round, then 64 rounds of it:
    a request that chose 0 streams plainly, and no round of it measures drafting."""
    chosen = []
    for _ in range(requests):
        request = DraftLengthSelector(shared, 16)
        request.choose(1)
        s = request.choose(1)
        chosen.append(s)
        if s == 0:
            for _ in range(64):
                shared.observe(1, False, 0, 0, None, world.verify_seconds(1, 0))
        else:
            world.run(request, 1, 64)
    return chosen


def test_one_slow_draft_does_not_price_drafting_out():
    """After one draft that waited 2 s (an SSM stub being reloaded), averaged in as it was, every
    request decoded plainly and drafted nothing that could correct the estimate, until the memory
    forgot it (seen served, before the memory: `vote` at `off`'s speed for a whole run). One sample
    moves a known cost by at most `cost_outlier_factor` times it."""
    world = World(0.95, draft_per_token=0.001, seed=12)
    shared = SharedLengthStats()
    world.run(DraftLengthSelector(shared, 16), 1, 100)
    assert world.best(1) > 0 and shared.draft_estimate(1, False) < 0.002
    shared.observe(1, False, 4, 4, 2.0, world.verify_seconds(1, 4))  # 0.5 s a token, once
    assert shared.draft_estimate(1, False) < 0.004
    assert first_choices(shared, world, 1)[0] > 0


def test_a_stall_that_priced_drafting_out_is_forgotten():
    """A stall of many rounds (every draft waiting 0.5 s a token) does price drafting out, as it should
    while it lasts; with no round measuring drafting since, the estimate is forgotten after
    `cost_memory_rounds` rounds and requests draft again."""
    world = World(0.95, draft_per_token=0.001, seed=12)
    shared = SharedLengthStats()
    world.run(DraftLengthSelector(shared, 16), 1, 100)
    for _ in range(20):
        shared.observe(1, False, 4, 4, 2.0, world.verify_seconds(1, 4))
    chosen = first_choices(shared, world, 2 * shared.policy.cost_memory_rounds // 64)
    assert chosen[0] == 0, "the stall priced drafting out"
    assert chosen[-1] > 0 and shared.draft_estimate(1, False) < 0.002, chosen
    assert shared.probe_draft_estimate(1, False) < 0.002


def test_a_drafting_costs_first_sample_alone_does_not_set_it():
    """The median of the first `cost_seed_samples` measures: a first draft that stalled is one of them."""
    shared = SharedLengthStats()
    shared.observe(1, False, 4, 4, 2.0, 0.05)
    assert shared.draft_estimate(1, False) == 0.0, "unknown after one measure"
    shared.observe(1, False, 4, 4, 0.004, 0.05)
    shared.observe(1, False, 4, 4, 0.006, 0.05)
    assert shared.draft_estimate(1, False) == pytest.approx(0.0015)


def test_a_drafting_cost_at_another_load_stands_in_until_this_loads_is_known():
    shared = SharedLengthStats()
    for _ in range(3):
        shared.observe(1, False, 4, 4, 0.004, 0.05)
    shared.observe(8, False, 4, 4, 0.4, 0.05)
    assert shared.draft_estimate(8, False) == pytest.approx(0.001)


def test_a_drafting_cost_forgotten_starts_again_from_the_next_measures():
    shared = SharedLengthStats(LengthPolicy(cost_memory_rounds=10))
    for _ in range(3):
        shared.observe(1, False, 4, 4, 0.4, 0.05)
    assert shared.draft_estimate(1, False) == pytest.approx(0.1)
    for _ in range(10):
        shared.observe(1, False, 0, 0, None, 0.02)
    assert shared.draft_estimate(1, False) == pytest.approx(0.1), "remembered for 10 rounds"
    shared.observe(1, False, 0, 0, None, 0.02)
    assert shared.draft_estimate(1, False) == 0.0 and shared.probe_draft_estimate(1, False) == 0.0
    for _ in range(3):
        shared.observe(1, False, 4, 4, 0.004, 0.05)
    assert shared.draft_estimate(1, False) == pytest.approx(0.001), "not averaged with the forgotten 0.1"


def test_a_round_drafted_ahead_by_some_of_the_request_s_ssms_is_not_the_request_s_acceptance():
    """A lookup's whole copy verified ahead of the vote's models (Proposal.ahead) goes to the lookup's
    own statistics; the request's acceptance, which prices the whole set's next length, keeps to the
    rounds the set drafted."""
    selector = DraftLengthSelector(SharedLengthStats(), max_length=8, drafters=("model", "lookup"))
    selector.observe(1, 16, 16, 0.001, 0.05, drafters=("lookup",))
    assert selector.acceptance.trials == []
    selector.observe(1, 4, 2, 0.001, 0.05)
    assert selector.acceptance.trials == [1.0, 1.0, 1.0] and selector.acceptance.accepted == [1.0, 1.0, 0.0]


def test_worth_s_worked_example_holds():
    """pricing/worth.py's docstring: chances 0.95, 0.9, 0.5, 0.2 against t(0..4) = 11, 16, 21, 25, 32 ms
    cost 8.2, 7.4, 7.5, 9.0 ms a token: 2 tokens are verified."""
    chances = [0.95, 0.9, 0.5, 0.2]
    log_probs = token_log_probs(chances)
    t = dict(enumerate([0.011, 0.016, 0.021, 0.025, 0.032]))
    n, per_token = cheapest_verification(log_probs, t)
    assert n == 2 and per_token == pytest.approx(0.021 / 2.85)
    assert worth_verifying(log_probs, t) == 2


def test_worth_s_worked_example_of_a_probe_holds():
    """pricing/worth.py's docstring: the same draft found by a probe, whose verification also costs the
    stream's restart: at 9 ms beyond a step its 2 tokens cost 10.5 ms a token against 11.0 and are
    verified (the length chosen without the restart); at 13 ms, 11.9, and nothing is."""
    log_probs = token_log_probs([0.95, 0.9, 0.5, 0.2])
    t = dict(enumerate([0.011, 0.016, 0.021, 0.025, 0.032]))
    n, per_token = cheapest_verification(log_probs, t, overhead=0.009)
    assert n == 2 and per_token == pytest.approx(0.030 / 2.85)
    assert worth_verifying(log_probs, t, overhead=0.013) == 0


def test_a_stream_s_restart_costs_what_its_first_token_took_beyond_a_step():
    """restart_extra: the restarted streams' first tokens against a streamed step at the nearest load
    measured; nothing before both are measured, never below nothing."""
    table = VerifyCostTable(plain_streams=True)

    def extra(batch: int) -> float:  # against the streamed step the table estimates, as the loop asks
        return table.restart_extra(batch, table.estimate(batch, 0))

    assert extra(1) == 0.0
    table.observe_restart(1, 0.020)
    assert extra(1) == 0.0, "no streamed step measured yet"
    for _ in range(5):
        table.observe(1, 0, 0.008)
    assert extra(1) == pytest.approx(0.012) and extra(2) == pytest.approx(0.012)
    for _ in range(30):  # restarts that came back faster than a streamed step: a moving average of them
        table.observe_restart(1, 0.001)
    assert extra(1) == 0.0
