"""Vote and bandit drafting inside the real decoding loop (tiny torch engines + n-gram, in process)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from decoding import (PROMPTS, BrokenEngine, HungClient, InProcessClient, Plan, assert_all_released, collect, decode,
                      make_plan, within)
from laws import goodness_of_fit
from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.sampling import SamplingParams, target_probs
from minions.settings import DEFAULTS
from minions.speculation.bandit import Ucb1
from minions.speculation.health import SsmHealth
from minions.speculation.pricing.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.mode import Speculation, SpeculationMode
from minions.speculation.weights import SsmWeights
from tiny_models import VOCAB, hf_greedy, next_logits

ALL = ("self", "other", "ngram")
DEADLINE_S = 0.5
DEADLINE_MS = 1000 * DEADLINE_S
"""The vote's deadline where one SSM is late on purpose (LateClient, SlowClient, HungClient): far above
what the tiny models and the lookup take to draft on a busy machine, so that only the late one misses it."""


def vote_plan(prompt, n, ssms=ALL, **kwargs) -> Plan:
    return make_plan(prompt, n, Speculation(SpeculationMode.VOTE, ssms), **kwargs)


def bandit_plan(prompt, n, ssms=ALL, **kwargs) -> Plan:
    return make_plan(prompt, n, Speculation(SpeculationMode.BANDIT, ssms), **kwargs)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_vote_and_bandit_greedy_equal_plain_decoding(client, engines, tiny_llm, prompt):
    want = hf_greedy(tiny_llm, prompt, 14)
    assert decode(client, vote_plan(prompt, 14, num_draft_tokens=3))[0] == want
    assert decode(client, bandit_plan(prompt, 14, num_draft_tokens=3))[0] == want
    assert_all_released(engines)
    for ssm in ALL:
        assert (ssm, "req") in client.released


def test_vote_asks_every_ssm_and_sends_one_draft_per_round(client):
    tokens, stats, rounds = decode(client, vote_plan(PROMPTS[0], 12, num_draft_tokens=3, vote_explore_every=1))
    llm_calls = [r for m, r in client.calls if m == "llm" and not r.stop]
    assert len(llm_calls) == len(rounds) == stats.rounds == stats.llm_calls
    voted = [r for r in rounds if r.drafts]
    assert voted and all(set(r.drafts) == set(ALL) for r in voted)
    for r in voted:
        if r.drafted:
            assert r.ssm is not None and r.drafts[r.ssm][: r.drafted] == [c.draft for m, c in client.calls if m == "llm"][rounds.index(r)]


def test_weights_learn_which_ssm_the_llm_agrees_with(client):
    """'self' drafts with the LLM's own weights: across requests it must end up the heaviest."""
    rng = np.random.default_rng(0)
    weights = SsmWeights(ALL)
    for i in range(4):
        prompt = [int(t) for t in rng.integers(0, VOCAB, 6)]
        decode(client, vote_plan(prompt, 30, num_draft_tokens=3, weights=weights, vote_explore_every=1), f"r{i}")
    w = weights.snapshot()
    assert w["self"] > w["ngram"] and w["self"] > w["other"]
    assert w["self"] > 1.0


def test_a_dominant_ssm_drafts_alone_between_exploration_rounds(client):
    """Every 3rd round one challenger, in turn, drafts beside it; otherwise it drafts alone."""
    weights = SsmWeights(ALL, initial={"self": 10.0, "other": 0.1, "ngram": 0.1})
    _, _, rounds = decode(client, vote_plan(PROMPTS[0], 30, num_draft_tokens=2, weights=weights, vote_explore_every=3))
    asked = [sorted(r.drafts) for r in rounds if r.drafts]  # the first and last rounds draft nothing
    assert ["self"] in asked
    assert ["other", "self"] in asked and ["ngram", "self"] in asked
    assert all(a in (["self"], ["other", "self"], ["ngram", "self"]) for a in asked)
    assert asked.count(["self"]) > len(asked) // 2


class SlowClient(InProcessClient):
    """Delays one model's answers, as a slow SSM on a loaded machine would."""

    def __init__(self, engines, slow: str, delay_s: float) -> None:
        super().__init__(engines)
        self.slow, self.delay_s = slow, delay_s
        self.in_flight = self.most_in_flight = self.started = 0

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        if model == self.slow and not request.stop:
            self.in_flight += 1
            self.started += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                self.in_flight -= 1
        return await super().generate(model, request)


class LateClient(InProcessClient):
    """One model's drafts answer only once the LLM has begun verifying the round after the one they were
    asked for (a slow SSM, one round late), so a round that waited for such a draft would never be
    verified (decode_late's deadline then fails the test). Records, for each LLM verification (round),
    how many of the slow model's calls were still unanswered as it began, and in which round each
    slow call was asked."""

    def __init__(self, engines, slow: str) -> None:
        super().__init__(engines)
        self.slow = slow
        self.in_flight = self.most_in_flight = self.started = self.answered = 0
        self.verifications = 0
        self.pending_at_verification: list[int] = []
        self.asked_in_round: list[int] = []

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        if model == "llm" and not request.stop:
            self.pending_at_verification.append(self.in_flight)
            self.verifications += 1
        elif model == self.slow and not request.stop:
            asked = self.verifications  # rounds verified before this one: its index
            self.asked_in_round.append(asked)
            self.in_flight += 1
            self.started += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await self.until(lambda c: c.verifications > asked + 1)
            finally:
                self.in_flight -= 1
            self.answered += 1
        return await super().generate(model, request)


def decode_late(client: LateClient, p: Plan):
    """decode(), failing the test if the request does not end (a round waiting for the late SSM)."""
    rounds = asyncio.run(within(collect(client, p), 60, "the request's rounds going on without the late SSM"))
    return [t for r in rounds for t in r.tokens], rounds


def test_a_round_waits_for_the_deadline_not_for_the_slowest_ssm(engines, tiny_llm):
    """A late SSM is dropped from the round and not scored; it is slow, not broken, so no breaker opens."""
    client = LateClient(engines, "other")
    health = SsmHealth(threshold=2)
    weights = SsmWeights(ALL)
    tokens, rounds = decode_late(client, vote_plan(PROMPTS[1], 10, num_draft_tokens=2, vote_deadline_ms=DEADLINE_MS,
                                                   vote_explore_every=1, health=health, weights=weights))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[1], 10)
    voted = [r for r in rounds if r.drafts]
    assert voted[0].failed == ("other",)
    assert all(r.failed in ((), ("other",)) and "other" not in r.drafts for r in voted)
    assert len(client.pending_at_verification) == len(rounds)
    late = [i for i, r in enumerate(rounds) if "other" in r.failed]
    assert late and set(late) <= set(client.asked_in_round), "a round reports it late only if it asked it"
    assert all(client.pending_at_verification[i] == 1 for i in late), \
        "each such round was verified while the late SSM was still drafting"
    assert client.answered > 0, "the late SSM did answer, after its round"
    assert health.available("other")
    assert weights.snapshot()["other"] == 1.0, "queued is not wrong: its weight is left alone"


def test_ssm_failing_mid_request_under_vote_never_fails_the_request(engines, tiny_llm):
    broken = BrokenEngine(engines["self"], working_calls=2)
    client = InProcessClient({**engines, "broken": broken})
    health = SsmHealth(threshold=2, cooldown_s=3600)
    ssms = ("broken", "other")
    tokens, _, rounds = decode(client, vote_plan(PROMPTS[0], 16, ssms, num_draft_tokens=2, health=health, vote_explore_every=1))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 16)
    assert any(r.failed == ("broken",) for r in rounds)
    assert not health.available("broken")
    later = rounds[[i for i, r in enumerate(rounds) if r.failed][-1] + 1 :]
    assert later and all(set(r.drafts) <= {"other"} for r in later), "the broken SSM is skipped once its breaker opens"


def test_no_ssm_answering_means_plain_decoding(engines, tiny_llm):
    client = InProcessClient({**engines, "b1": BrokenEngine(engines["self"], 0), "b2": BrokenEngine(engines["other"], 0)})
    tokens, stats, _ = decode(client, vote_plan(PROMPTS[0], 8, ("b1", "b2"), num_draft_tokens=2, health=SsmHealth(threshold=100)))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 8)
    assert stats.draft_tokens == 0


def test_bandit_tries_every_ssm_and_prefers_the_best(client):
    bandit = Ucb1(ALL)
    for i in range(3):
        decode(client, bandit_plan(PROMPTS[i % 3], 24, num_draft_tokens=3, bandit=bandit), request_id=f"r{i}")
    arms = bandit.arms
    assert all(a.pulls > 0 for a in arms.values())
    assert arms["self"].mean > arms["other"].mean


def test_bandit_sampled_drafts_carry_logits(client):
    p = bandit_plan(PROMPTS[0], 10, ("other",), num_draft_tokens=2, sampling=SamplingParams(temperature=0.8), seed=3,
                    use_draft_logits=True)
    decode(client, p)
    drafted = [r for m, r in client.calls if m == "llm" and r.draft]
    assert drafted and all(r.draft_logits is not None for r in drafted)


def test_sampled_vote_is_lossless(client, tiny_llm):
    """End to end: with a vote of several SSMs (greedy drafts, deterministic rule) and T=1 sampling,
    tokens 2 and 3 (the first speculative round) follow the LLM's exact joint law (chi-square)."""
    params = SamplingParams(temperature=1.0)
    prompt = [3, 7, 1]
    law = np.zeros(VOCAB * VOCAB)
    p1 = target_probs(next_logits(tiny_llm, prompt), params)
    for t1 in range(VOCAB):
        p2 = target_probs(next_logits(tiny_llm, prompt + [t1]), params)
        for t2 in range(VOCAB):
            if p1[t1] * p2[t2] > 0:
                p3 = target_probs(next_logits(tiny_llm, prompt + [t1, t2]), params)
                law[t2 * VOCAB : (t2 + 1) * VOCAB] += p1[t1] * p2[t2] * p3
    counts = np.zeros(VOCAB * VOCAB, dtype=np.int64)
    weights = SsmWeights(ALL)
    for seed in range(1200):
        tokens = decode(client, vote_plan(prompt, 3, ("self", "other"), num_draft_tokens=2, sampling=params, seed=seed,
                                          weights=weights, vote_explore_every=1, use_draft_logits=True), f"s{seed}")[0]
        counts[tokens[1] * VOCAB + tokens[2]] += 1
    assert all(r.draft_logits is None for m, r in client.calls if m == "llm"), "a vote's draft is judged as deterministic"
    assert goodness_of_fit(counts, law) > 1e-3


def test_exploration_rounds_wait_only_for_the_dominant_ssm(engines, tiny_llm):
    """The others are scored if they finish during verification, and are never counted as failures."""
    client = LateClient(engines, "other")
    weights = SsmWeights(ALL, initial={"self": 10.0, "other": 0.1, "ngram": 0.1})
    tokens, rounds = decode_late(client, vote_plan(PROMPTS[0], 12, num_draft_tokens=2, weights=weights,
                                                   vote_explore_every=1, vote_deadline_ms=5000.0))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 12)
    drafted = [r for r in rounds if r.drafts]
    assert drafted and all(r.failed == () for r in rounds)
    assert any("ngram" in r.drafts for r in drafted), "a fast challenger joins its round"
    assert all("other" not in r.drafts for r in drafted), "a slow one does not delay it"
    assert client.asked_in_round, "the slow challenger was asked"
    assert all(client.pending_at_verification[i] == 1 and "self" in rounds[i].drafts for i in client.asked_in_round), \
        "each round it explored in was verified on the dominant SSM's draft while it still drafted"


def test_a_dominant_ssm_slower_than_the_deadline_still_drafts_its_exploration_rounds(engines, tiny_llm):
    """The deadline is for a real vote's voters; beside challengers, the dominant SSM is waited for, as
    in the rounds it drafts alone (a loaded drafter is slow, and its round would otherwise go undrafted)."""
    client = SlowClient(engines, "self", delay_s=2 * DEADLINE_S)
    weights = SsmWeights(ALL, initial={"self": 10.0, "other": 0.1, "ngram": 0.1})
    tokens, _, rounds = decode(client, vote_plan(PROMPTS[0], 12, num_draft_tokens=2, weights=weights,
                                                 vote_explore_every=1, vote_deadline_ms=DEADLINE_MS))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 12)
    drafted = [r for r in rounds if r.drafts or r.failed]
    assert drafted and all(r.failed == () and "self" in r.drafts for r in drafted)


def test_a_slow_ssm_never_has_two_calls_in_flight_for_one_request(engines, tiny_llm):
    """Otherwise its late calls queue up behind each other faster than it drains them."""
    client = LateClient(engines, "other")
    tokens, rounds = decode_late(client, vote_plan(PROMPTS[0], 16, num_draft_tokens=1, vote_deadline_ms=DEADLINE_MS,
                                                   vote_explore_every=1))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 16)
    assert client.most_in_flight == 1
    assert 0 < client.started < len([r for r in rounds if r.drafts or r.failed]), "rounds went on without the busy SSM"


def test_a_round_that_waited_for_a_late_ssm_is_not_a_measure_of_drafting(engines, tiny_llm):
    """Such a round's drafting time is the vote's deadline, not what drafting costs: taken as a sample,
    one stalled or dying SSM priced drafting out for every request after (docs/adaptive-draft-length.md).
    Rounds whose SSMs all answered in time still measure it."""
    stats = SharedLengthStats()
    client = LateClient(engines, "other")
    _, rounds = decode_late(client, vote_plan(PROMPTS[1], 12, num_draft_tokens=2, vote_deadline_ms=DEADLINE_MS,
                                              vote_explore_every=1, length_stats=stats))
    drafted = [r for r in rounds if r.drafted]
    in_time = [r for r in drafted[1:] if not r.failed]  # (a request's first draft is never a measure)
    assert in_time and len(in_time) < len(drafted) - 1, "some rounds waited for the late SSM, some did not"
    assert stats.draft_per_token.table[ALL, False, 1].count == len(in_time)




def _frozen_costs(drafters: tuple[str, ...], draft_per_token: float, candidates: tuple[int, ...]) -> SharedLengthStats:
    """A server whose measured costs no round moves: verifying costs a plain step (10 ms) whatever the
    draft, and the vote of `drafters` drafted at `draft_per_token` seconds a token, each draft accepted
    whole (so that the length policy drafts the longest of `candidates`)."""
    stats = SharedLengthStats(LengthPolicy(candidates=candidates))
    for k in range(17):
        for _ in range(8):
            stats.verify.observe(1, k, 0.01)
    for _ in range(50):
        stats.observe(1, False, 1, 1, draft_per_token, 0.01, drafters)
    stats.verify.weight = 0.0  # the cost tables' (and drafting's) averages take no more samples
    return stats


def test_a_vote_verifies_a_lookup_s_whole_copy_instead_of_asking_its_model_ssm(client, engines, tiny_llm):
    """A vote of a model SSM and prompt lookup whose model drafts one token for 9 ms (the policy plans
    k = 1): where the lookup's draft, asked whole, costs less per token than the model's would, it is
    verified in their place, longer than k, and the model is not asked that round
    (test_lookups_first.py has the rule). Greedy output is the LLM's."""
    ssms = ("self", "ngram")
    prompt, n = PROMPTS[0], 40  # the LLM's answer repeats (0, 5, 9): lookup drafts it
    stats = _frozen_costs(ssms, draft_per_token=0.009, candidates=(0, 1))
    p = vote_plan(prompt, n, ssms, num_draft_tokens=None, confident_ssms=frozenset({"ngram"}), length_stats=stats)
    tokens, _, rounds = decode(client, p)
    assert tokens == hf_greedy(tiny_llm, prompt, n)
    assert max(r.planned for r in rounds) == 1
    instead = [r for r in rounds if r.ssm == "ngram" and set(r.drafts) == {"ngram"}]
    assert instead and max(r.drafted for r in instead) > 1, "lookup drafts longer than k, verified alone"
    # Those rounds are the lookup's own in the server's statistics, not the vote's: the models' J(k)
    # is priced from the rounds they drafted.
    assert 0 < (stats.acceptance_of(("ngram",)).trials or [0])[0] <= len(instead), "(decayed counts)"
    assert any(r.request_output_len == DEFAULTS.limits.num_draft_tokens
               for m, r in client.calls if m == "ngram" and not r.stop), "asked whole"


@pytest.mark.parametrize("fault", ["broken", "hung"])
def test_a_lookup_that_fails_or_hangs_when_asked_first_never_fails_the_request(engines, tiny_llm, fault):
    """The lookup a vote asks ahead of its model SSM fails (a dead stub) or never answers: the round goes
    on with the model's draft (a hung lookup costs the vote's deadline once: its call stays in flight,
    and it is not asked again meanwhile), and the output is the LLM's."""
    ssms = ("self", "ngram")
    if fault == "broken":
        client = InProcessClient({**engines, "ngram": BrokenEngine(engines["ngram"], working_calls=1)})
    else:
        client = HungClient(engines, hung="ngram")
    prompt, n = PROMPTS[0], 24
    p = vote_plan(prompt, n, ssms, num_draft_tokens=None, confident_ssms=frozenset({"ngram"}),
                  vote_deadline_ms=DEADLINE_MS, health=SsmHealth(threshold=2, cooldown_s=3600),
                  length_stats=_frozen_costs(ssms, 0.009, (0, 1)))
    tokens, _, rounds = decode(client, p)
    assert tokens == hf_greedy(tiny_llm, prompt, n)
    assert any("ngram" in r.failed for r in rounds), "the lookup's failure or lateness was seen"
    assert any(r.ssm == "self" for r in rounds), "the model drafted on"
    asked = [r for m, r in client.calls if m == "ngram" and not r.stop]
    assert len(asked) <= (2 if fault == "broken" else 1) + 1, "a broken lookup trips its breaker, a hung one stays busy"
    assert_all_released(engines)
