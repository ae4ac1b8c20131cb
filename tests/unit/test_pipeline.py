"""Pipelined decoding, the adaptive draft length in the loop, and the pool / KV admission throttles.

The loop runs against real tiny engines in process (decoding.InProcessClient). Every
expected output is computed from the LLM alone (HF greedy decoding, or the exact sampling law).
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from decoding import PROMPTS, InProcessClient, Plan, assert_all_released, collect, decode, make_plan, rounds_of, within
from laws import goodness_of_fit
from minions.decoding.sampling import SamplingParams, target_probs
from minions.speculation.pricing.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.mode import OFF, Speculation, SpeculationMode
from minions.speculation.pool import DraftPool
from minions.speculation.rounds import DecodeStats
from tiny_models import VOCAB, hf_greedy, next_logits

SPECULATIONS = [Speculation(SpeculationMode.SINGLE, ("self",)), Speculation(SpeculationMode.SINGLE, ("other",)), Speculation(SpeculationMode.SINGLE, ("ngram",)),
                Speculation(SpeculationMode.VOTE, ("self", "other", "ngram"))]


def full_plan(prompt, n, speculation, **kwargs) -> Plan:
    """Full Minions: adaptive length (num_draft_tokens None) and the pipeline."""
    kwargs.setdefault("num_draft_tokens", None)
    return make_plan(prompt, n, speculation, pipeline=True, **kwargs)


@pytest.mark.parametrize("speculation", SPECULATIONS, ids=str)
def test_pipelined_adaptive_greedy_equals_plain_decoding(client, engines, tiny_llm, speculation):
    for i, prompt in enumerate(PROMPTS):
        tokens, _, _ = decode(client, full_plan(prompt, 16, speculation), f"r{i}")
        assert tokens == hf_greedy(tiny_llm, prompt, 16)
    assert_all_released(engines)


def test_early_drafts_are_used_when_the_assumption_holds_and_dropped_otherwise(client):
    perfect = DecodeStats()
    for r in decode(client, full_plan(PROMPTS[0], 20, Speculation(SpeculationMode.SINGLE, ("self",)), num_draft_tokens=3))[2]:
        perfect.add(r)
    assert perfect.pipelined_drafts >= 3 and perfect.discarded_early_drafts == 0
    noisy = DecodeStats()
    for i, prompt in enumerate(PROMPTS):
        for r in decode(client, full_plan(prompt, 20, Speculation(SpeculationMode.SINGLE, ("other",)), num_draft_tokens=3), f"n{i}")[2]:
            noisy.add(r)
    assert noisy.discarded_early_drafts > 0 and noisy.pipelined_drafts > 0


@pytest.mark.parametrize("load, most_early", [(1, 20), (3, 1)])
def test_early_drafts_stop_above_the_pipeline_load_limit(client, tiny_llm, load, most_early):
    """Above the limit only round 1 (plain decoding) drafts early: the SSM's prefill of the prompt."""
    plan = full_plan(PROMPTS[0], 20, Speculation(SpeculationMode.SINGLE, ("self",)), num_draft_tokens=3, pipeline_max_load=2,
                     load=lambda: load)
    tokens, _, rounds = decode(client, plan, f"load{load}")
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 20)
    assert rounds[1].pipelined, "round 2 used the draft made from the prompt during round 1"
    assert 1 <= sum(r.pipelined for r in rounds) <= most_early
    assert load == 3 or sum(r.pipelined for r in rounds) > 1


@pytest.mark.parametrize("min_hit, fewest, most", [(0.0, 1, 1), (0.5, 8, 20)])
def test_above_the_load_limit_early_drafts_are_made_while_likely_used(client, tiny_llm, min_hit, fewest, most):
    """Adaptive length above the load limit: a perfect drafter's early drafts go on while the selector
    expects them to pass (prior 0.9 per position: 0.73 for the 3 positions, then more as they pass);
    with no pipeline_min_hit only round 1 drafts early."""
    policy = LengthPolicy(candidates=(2,), initial=2, prior_acceptance=0.9, explore_every=0)
    plan = full_plan(PROMPTS[0], 30, Speculation(SpeculationMode.SINGLE, ("self",)), pipeline_max_load=2, load=lambda: 3,
                     pipeline_min_hit=min_hit, length_stats=SharedLengthStats(policy))
    tokens, _, rounds = decode(client, plan, f"hit{min_hit}")
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 30)
    assert fewest <= sum(r.pipelined for r in rounds) <= most, [r.pipelined for r in rounds]


def test_early_drafts_take_up_the_selector_s_new_length(client, tiny_llm):
    """A perfect drafter whose early drafts always pass: once the selector moves from 2 to 6, the next
    early drafts are made at 6 (they were stuck at the first round's length before)."""
    # Seeded costs decide the first choice (6); a long dwell then holds it, so the test does not hang on
    # how this machine times the tiny models.
    shared = SharedLengthStats(LengthPolicy(candidates=(2, 6), initial=2, explore_every=0, dwell=100))
    for s in (2, 6):
        shared.verify.observe(1, s, 0.01)  # equal verification costs: 6 tokens per round win
    tokens, stats, rounds = decode(client, full_plan(PROMPTS[0], 40, Speculation(SpeculationMode.SINGLE, ("self",)),
                                                     length_stats=shared))
    assert tokens == hf_greedy(tiny_llm, PROMPTS[0], 40)
    planned = [r.planned for r in rounds]
    assert 6 in planned, planned
    later = [r for r in rounds[planned.index(6) + 1:] if not r.last]
    assert later and all(r.drafted == 6 and r.pipelined for r in later), [(r.drafted, r.pipelined) for r in rounds]


def test_fixed_length_is_respected_and_adaptive_records_its_choices(client):
    _, _, fixed = decode(client, full_plan(PROMPTS[2], 20, Speculation(SpeculationMode.SINGLE, ("self",)), num_draft_tokens=2))
    planned = [r.planned for r in fixed]
    assert set(planned[1:]) == {2} and planned[0] == 0
    shared = SharedLengthStats()
    _, adaptive, rounds = decode(client, full_plan(PROMPTS[2], 30, Speculation(SpeculationMode.SINGLE, ("ngram",)), length_stats=shared))
    assert len(rounds) == adaptive.rounds == adaptive.llm_calls
    assert shared.verify.cells, "verification costs were measured"


def test_every_request_measures_the_server_s_costs_and_leaves_the_batch_when_done(client):
    """Fixed lengths and plain decoding verify on the same LLM: their rounds feed the shared table."""
    shared = SharedLengthStats()
    decode(client, full_plan(PROMPTS[2], 12, Speculation(SpeculationMode.SINGLE, ("self",)), num_draft_tokens=3, length_stats=shared))
    lengths = {s for _, s in shared.verify.cells}
    assert 3 in lengths and max(lengths) == 3, shared.verify.cells  # (the last round may be shorter)
    assert shared.acceptance_of(("self",)).trials and shared.draft_per_token, "acceptance and drafting were measured"
    decode(client, full_plan(PROMPTS[0], 4, OFF, length_stats=shared))
    assert (1, 0) in shared.verify.cells, "plain decoding measures t(b, 0)"
    assert shared.drafting == {}, "finished requests no longer count in the batch's draft length"


def test_adaptive_stops_drafting_when_drafts_are_always_wrong(client, engines):
    """A drafter that is never right: the selector settles on s = 0 (bar its exploration rounds)."""

    class WrongEngine:
        def generate(self, request):
            from minions.decoding.engine_call import EngineResult
            truth = engines["llm"].generate(type(request)(f"probe-{request.request_id}", request.input_ids, 1)).tokens[0]
            engines["llm"].release(f"probe-{request.request_id}")
            return EngineResult([(truth + 1) % VOCAB] * request.request_output_len)

        def release(self, request_id):
            pass

    engines["wrong"] = WrongEngine()
    shared = SharedLengthStats()
    _, _, rounds = decode(client, full_plan(PROMPTS[0], 50, Speculation(SpeculationMode.SINGLE, ("wrong",)), length_stats=shared,
                                            max_draft_tokens=4))
    planned = [r.planned for r in rounds]
    tail = planned[-20:]
    assert tail.count(0) >= 16, planned


def test_sampled_pipelined_decoding_is_lossless(client, tiny_llm):
    """T=1 with sampled drafts and logits, s = 1, pipeline on: tokens 3 and 4 (the 4th often drafted during
    the previous verification) follow the LLM's exact law: the joint law, and token 4's own (the
    marginal has the power to see a wrong draft distribution on the pipelined path)."""
    params = SamplingParams(temperature=1.0)
    prompt = [3, 7, 1]
    law = np.zeros(VOCAB * VOCAB)
    p1 = target_probs(next_logits(tiny_llm, prompt), params)
    for t1, t2 in itertools.product(range(VOCAB), repeat=2):
        p2 = target_probs(next_logits(tiny_llm, prompt + [t1]), params)
        w = p1[t1] * p2[t2]
        if w < 1e-7:
            continue
        p3 = target_probs(next_logits(tiny_llm, prompt + [t1, t2]), params)
        for t3 in range(VOCAB):
            if w * p3[t3] < 1e-7:
                continue
            p4 = target_probs(next_logits(tiny_llm, prompt + [t1, t2, t3]), params)
            law[t3 * VOCAB : (t3 + 1) * VOCAB] += w * p3[t3] * p4
    law /= law.sum()
    counts = np.zeros(VOCAB * VOCAB, dtype=np.int64)
    stats = DecodeStats()
    for seed in range(1200):
        tokens, s, _ = decode(client, full_plan(prompt, 5, Speculation(SpeculationMode.SINGLE, ("other",)), num_draft_tokens=1,
                                                sampling=params, seed=seed, use_draft_logits=True), f"s{seed}")
        counts[tokens[2] * VOCAB + tokens[3]] += 1
        stats.pipelined_drafts += s.pipelined_drafts
    assert stats.pipelined_drafts > 100, "the pipelined path was exercised"
    assert goodness_of_fit(counts, law) > 1e-3
    assert goodness_of_fit(counts.reshape(VOCAB, VOCAB).sum(0), law.reshape(VOCAB, VOCAB).sum(0)) > 1e-3


# -- the pool and the KV admission -------------------------------------------------------------------

def test_pool_bound_holds_and_outputs_stay_exact_under_concurrency(client, engines, tiny_llm):
    pool = DraftPool(1)

    async def run_all():
        plans = [full_plan(p, 14, Speculation(SpeculationMode.SINGLE, ("self",)), num_draft_tokens=2, pool=pool) for p in PROMPTS]
        return await asyncio.gather(*(collect(client, p, f"c{i}") for i, p in enumerate(plans)))

    results = asyncio.run(run_all())
    for prompt, rounds in zip(PROMPTS, results):
        assert [t for r in rounds for t in r.tokens] == hf_greedy(tiny_llm, prompt, 14)
    assert pool.peak == 1 and pool.held == 0 and pool.waits > 0
    assert_all_released(engines)


def test_cancelling_requests_mid_pipeline_frees_everything_and_does_not_deadlock(client, engines, tiny_llm):
    pool = DraftPool(2)

    async def consume(i, prompt, stop_after):
        rounds = []
        from contextlib import aclosing

        async with aclosing(rounds_of(client, full_plan(prompt, 30, Speculation(SpeculationMode.SINGLE, ("other",)),
                                                                 num_draft_tokens=2, pool=pool), f"x{i}")) as gen:
            async for r in gen:
                rounds.append(r)
                if len(rounds) == stop_after:
                    break
        return rounds

    def verifications(c, request_id: str) -> int:
        return sum(1 for m, r in c.calls if m == "llm" and r.request_id == request_id and not r.stop)

    async def scenario():
        tasks = [asyncio.ensure_future(consume(i, PROMPTS[i % 3], 100)) for i in range(6)]
        # Every request past its plain first round and into speculation (none can have finished: 30
        # tokens take more than 2 rounds of at most 3), contending for the pool's 2 slots.
        await within(client.until(lambda c: all(verifications(c, f"x{i}") >= 2 for i in range(6))), 60,
                     "every request reaching its second verification")
        assert not any(t.done() for t in tasks) and pool.waits > 0, "all mid-request, some waiting for a slot"
        for t in tasks[::2]:
            t.cancel()  # cancelled while drafting, verifying or waiting for a slot
        done = await within(asyncio.gather(*tasks, return_exceptions=True), 60, "the requests ending")
        closed = await within(consume(9, PROMPTS[0], 3), 60, "a request stopped early by its consumer")
        after = await within(consume(10, PROMPTS[1], 100), 60, "a request after the cancellations")
        return done, closed, after

    done, closed, after = asyncio.run(scenario())
    for i, d in enumerate(done):
        if i % 2 == 0:
            assert isinstance(d, asyncio.CancelledError), f"x{i}, cancelled mid-pipeline, ends cancelled: {d!r}"
        else:
            assert [t for r in d for t in r.tokens] == hf_greedy(tiny_llm, PROMPTS[i % 3], 30), f"x{i}: {d!r}"
    assert len(closed) == 3
    assert [t for r in after for t in r.tokens] == hf_greedy(tiny_llm, PROMPTS[1], 30)
    assert pool.held == 0 and pool.peak <= 2
    assert_all_released(engines)


class DraftAnsweredClient(InProcessClient):
    """Counts the SSM's answered draft calls, telling `until` as each answer is handed back."""

    def __init__(self, engines: dict, ssm: str) -> None:
        super().__init__(engines)
        self.ssm = ssm
        self.drafts_answered = 0

    async def generate(self, model: str, request):
        result = await super().generate(model, request)
        if model == self.ssm and not request.stop:
            self.drafts_answered += 1
            self.notify()
        return result


def test_a_request_cancelled_as_its_draft_arrives_ends_cancelled(engines):
    client = DraftAnsweredClient(engines, "self")

    async def scenario():
        task = asyncio.ensure_future(collect(client, make_plan(PROMPTS[0], 30, Speculation(SpeculationMode.SINGLE, ("self",)),
                                                               num_draft_tokens=2), "late-cancel"))
        # Woken as the first draft call returns, before the request's task has taken its answer.
        await within(client.until(lambda c: c.drafts_answered >= 1), 30, "the SSM answering a draft")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            rounds = await within(task, 30, "the cancelled request ending")
            print(f"not cancelled: decoded {sum(len(r.tokens) for r in rounds)} tokens")

    asyncio.run(scenario())
    assert {m for m, rid in client.released if rid == "late-cancel"} == {"llm", "self"}
    assert_all_released(engines)


def test_pool_try_acquire_never_overtakes_and_cancelled_waiters_give_back():
    async def scenario():
        pool = DraftPool(1)
        first = await pool.acquire()
        waiter = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        assert pool.try_acquire() is None, "full, and someone is waiting"
        waiter.cancel()
        await asyncio.sleep(0)
        first.release()
        assert pool.held == 0
        second = pool.try_acquire()
        assert second is not None and pool.held == 1
        second.release()
        second.release()  # idempotent
        assert pool.held == 0

    asyncio.run(scenario())
