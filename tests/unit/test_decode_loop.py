"""minions.speculation.loop: the orchestrator's loop against real engines over an in-process
transport (decoding.InProcessClient; the engines are the fixtures of conftest.py)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import numpy as np
import pytest

from decoding import (PROMPTS, BrokenEngine, HungClient, InProcessClient, Plan, assert_all_released, decode, make_plan,
                      rounds_of, within)
from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import SamplingParams, log_prob
from minions.engines.torch_engine import TorchEngine
from minions.errors import InvalidRequest
from minions.settings import DEFAULTS
from minions.speculation.mode import OFF, Speculation, SpeculationMode
from minions.speculation.pricing.length_stats import SharedLengthStats
from minions.speculation.rounds import DecodeStats
from tiny_models import hf_greedy, next_logits

SSMS = ("self", "other", "ngram")


def plan(prompt, n, ssm=None, **kwargs) -> Plan:
    return make_plan(prompt, n, Speculation(SpeculationMode.SINGLE, (ssm,)) if ssm else OFF, **kwargs)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculation_equals_plain_decoding(client, engines, tiny_llm, prompt):
    """Greedy speculative decoding is exact: every SSM gives the LLM's own greedy output."""
    want = hf_greedy(tiny_llm, prompt, 14)
    off, _, _ = decode(client, plan(prompt, 14))
    assert off == want
    for ssm in SSMS:
        tokens, _, _ = decode(client, plan(prompt, 14, ssm, num_draft_tokens=3))
        assert tokens == want, f"speculation single:{ssm}"
    assert_all_released(engines)


def _greedy_with(model, prompt: list[int], n: int, penalties: Penalties, end_id: int | None) -> list[int]:
    """The reference: greedy decoding from from-scratch logits with `penalties` applied at each step."""
    sequence, out = list(prompt), []
    while len(out) < n and (not out or out[-1] != end_id):
        token = int(np.argmax(penalties.apply(next_logits(model, sequence), sequence, end_id)))
        out.append(token)
        sequence.append(token)
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculation_with_penalties_equals_plain_decoding_with_them(client, engines, tiny_llm, prompt):
    """Penalties and min_tokens reach the LLM through the engine tensors and apply to plain tokens and to
    every verified position alike: every SSM gives plain decoding's output, which the penalties change."""
    end_id = hf_greedy(tiny_llm, prompt, 3)[2]  # ends plain greedy decoding early unless min_tokens holds it off
    penalties = Penalties(repetition=1.5, presence=0.4, frequency=0.3, min_tokens=8, prompt_length=len(prompt))
    want = _greedy_with(tiny_llm, prompt, 14, penalties, end_id)
    assert want != _greedy_with(tiny_llm, prompt, 14, NO_PENALTIES, end_id)
    off, _, _ = decode(client, plan(prompt, 14, penalties=penalties, end_id=end_id))
    assert off == want
    for ssm in SSMS:
        tokens, _, _ = decode(client, plan(prompt, 14, ssm, num_draft_tokens=3, penalties=penalties, end_id=end_id))
        assert tokens == want, f"speculation single:{ssm}"
    assert_all_released(engines)


def test_log_probs_are_the_llms_own_for_every_emitted_token_whatever_the_mode(client, tiny_llm):
    """Each emitted token's log probability, from the LLM's raw logits at its position: the same under
    speculation as in plain decoding (computed on the verification rows, not the SSM's)."""
    prompt = PROMPTS[0]
    off_tokens, _, off_rounds = decode(client, plan(prompt, 12, return_log_probs=True))
    off = [lp for r in off_rounds for lp in r.log_probs]
    assert len(off) == len(off_tokens) == 12
    want = [log_prob(next_logits(tiny_llm, prompt + off_tokens[:i]), t) for i, t in enumerate(off_tokens)]
    np.testing.assert_allclose(off, want, atol=1e-4)
    for ssm in SSMS:
        tokens, _, rounds = decode(client, plan(prompt, 12, ssm, num_draft_tokens=3, return_log_probs=True))
        assert tokens == off_tokens
        np.testing.assert_allclose([lp for r in rounds for lp in r.log_probs], want, atol=1e-4, err_msg=ssm)
    assert all(r.log_probs is None for r in decode(client, plan(prompt, 4))[2]), "only when asked"


def test_the_noisy_drafter_is_both_accepted_and_rejected(client):
    """Guard for the equality test above: the 'other' SSM exercises both outcomes of verification."""
    stats = DecodeStats()
    for i, prompt in enumerate(PROMPTS):
        for r in decode(client, plan(prompt, 14, "other", num_draft_tokens=3), f"r{i}")[2]:
            stats.add(r)
    assert 0.0 < stats.acceptance_rate < 1.0


@pytest.mark.parametrize("ssm", SSMS)
def test_stats_are_consistent(client, ssm):
    tokens, stats, rounds = decode(client, plan(PROMPTS[0], 20, ssm, num_draft_tokens=4))
    assert stats.emitted_tokens == len(tokens) == 20
    assert stats.rounds == len(rounds)
    assert stats.llm_calls == sum(1 for m, r in client.calls if m == "llm" and not r.stop) == len(rounds), (
        "the in-process LLM does not stream: every round is a call of its own")
    assert stats.drafts == sum(1 for r in rounds if r.drafted)
    assert stats.call_draft_lengths == [r.drafted for r in rounds]
    assert stats.draft_tokens == sum(r.drafted for r in rounds)
    assert 0 <= stats.accepted_tokens <= stats.draft_tokens
    assert sum(stats.accepted_per_position) == stats.accepted_tokens
    assert all(a >= b for a, b in zip(stats.accepted_per_position, stats.accepted_per_position[1:])), (
        "a draft token can only be accepted if the one before it was"
    )
    for r in rounds:
        assert r.drafted <= 4 and r.accepted <= r.drafted
        assert len(r.tokens) == r.accepted + 1, "accepted prefix plus exactly one token of the LLM's own"
        assert (r.ssm is None) == (r.drafted == 0)


def test_perfect_drafter_is_always_accepted_and_saves_llm_calls(client):
    tokens, stats, rounds = decode(client, plan(PROMPTS[0], 16, "self", num_draft_tokens=4))
    assert stats.draft_tokens > 0 and stats.acceptance_rate == 1.0
    assert stats.rounds == stats.llm_calls < 16, "each verification must emit several tokens"


def test_speculation_off_never_calls_an_ssm(client):
    tokens, stats, _ = decode(client, plan(PROMPTS[0], 6))
    assert len(tokens) == 6 and stats.drafts == 0 and stats.rounds == stats.llm_calls == 6
    assert {model for model, _ in client.calls} == {"llm"}


@pytest.mark.parametrize("ssm", [None, *SSMS])
@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_respects_max_new_tokens_exactly(client, engines, ssm, n):
    tokens, stats, _ = decode(client, plan(PROMPTS[1], n, ssm, num_draft_tokens=4))
    assert len(tokens) == n == stats.emitted_tokens
    for model, request in client.calls:
        if not request.stop and request.draft:
            assert len(request.draft) <= n - 1, "a draft must leave room for the LLM's own token"
    assert_all_released(engines)


@pytest.mark.parametrize("ssm", [None, *SSMS])
def test_stops_at_end_id(client, engines, tiny_llm, ssm):
    prompt = PROMPTS[0]
    want = hf_greedy(tiny_llm, prompt, 12)
    end_id = want[5]
    expected = want[: want.index(end_id) + 1]
    tokens, _, rounds = decode(client, plan(prompt, 12, ssm, end_id=end_id, num_draft_tokens=3))
    assert tokens == expected
    assert end_id not in [t for r in rounds[:-1] for t in r.tokens]
    assert_all_released(engines)


@pytest.mark.parametrize("ssm", [None, "self", "other"])
def test_closing_early_releases_every_engine(client, engines, ssm):
    """A client that disconnects closes the generator: the finally clause must free all cached state."""

    async def first_round():
        async with aclosing(rounds_of(client, plan(PROMPTS[0], 30, ssm), "early")) as rounds:
            async for r in rounds:
                assert len(engines["llm"].cache) == 1, "the LLM holds state while the request runs"
                return r

    r = asyncio.run(first_round())
    assert r.tokens
    used = {"llm"} | ({ssm} if ssm else set())
    assert set(client.released) == {(m, "early") for m in used}
    assert_all_released(engines)


def test_engine_error_still_releases(client, engines, tiny_llm):
    """The LLM fails mid-request (context exceeded): the error propagates and caches are freed."""
    engines["llm"] = TorchEngine(tiny_llm, max_context=12)
    client.engines = engines
    with pytest.raises(InvalidRequest, match="exceeds the engine's context"):
        decode(client, plan(PROMPTS[0], 20, "self", num_draft_tokens=3), "fails")
    assert {m for m, rid in client.released if rid == "fails"} == {"llm", "self"}
    assert_all_released(engines)


def test_sampled_decoding_is_reproducible_by_seed(client):
    params = SamplingParams(temperature=1.0, top_p=0.95)
    runs = [
        decode(client, plan(PROMPTS[2], 12, "other", sampling=params, seed=seed), f"s{i}")[0]
        for i, seed in enumerate((5, 5, 6))
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_every_call_of_a_seeded_request_carries_its_seed(client):
    """The engines key each position's draw by the request's seed (sampling.SeededDraws): each LLM call
    gets the seed itself, and each SSM call one derived from it, so that its draws are not the LLM's."""
    decode(client, plan(PROMPTS[0], 5, "self", sampling=SamplingParams(temperature=1.0), seed=11,
                        use_draft_logits=True))
    llm_seeds = {req.seed for model, req in client.calls if model == "llm" and not req.stop}
    ssm_seeds = {req.seed for model, req in client.calls if model == "self" and not req.stop}
    assert llm_seeds == {11} and len(ssm_seeds) == 1 and ssm_seeds.isdisjoint({11, None})




def test_a_failing_ssm_never_fails_the_request(engines, tiny_llm):
    """The round goes on without a draft; after `threshold` failures in a row the SSM is skipped."""
    from minions.speculation.health import SsmHealth

    health = SsmHealth(threshold=3, cooldown_s=3600)
    broken = BrokenEngine(engines["self"], working_calls=2)
    client = InProcessClient({**engines, "broken": broken})
    prompt = [3, 7, 1, 9, 4]
    tokens, _, rounds = decode(client, plan(prompt, 16, ssm="broken", num_draft_tokens=2, health=health))
    assert tokens == hf_greedy(tiny_llm, prompt, 16)
    assert [r.failed for r in rounds].count(("broken",)) == 3
    assert broken.calls == 2 + 3
    assert all(r.drafted == 0 for r in rounds if r.failed)
    assert not health.available("broken")
    assert ("broken", "req") in client.released, "released even so: a slow SSM with an open breaker holds state"
    # the breaker is shared: the next request does not ask the broken SSM at all
    decode(client, plan(prompt, 8, ssm="broken", num_draft_tokens=2, health=health), request_id="next")
    assert broken.calls == 5


@pytest.mark.parametrize("speculation", [
    Speculation(SpeculationMode.SINGLE, ("self",)),
    Speculation(SpeculationMode.VOTE, ("self", "other")),
    Speculation(SpeculationMode.BANDIT, ("self", "other")),
])
def test_a_hung_ssm_costs_a_bounded_wait_and_the_output_stays_exact(engines, tiny_llm, speculation):
    from minions.speculation.health import SsmHealth

    client = HungClient(engines, hung="self")
    health = SsmHealth(threshold=2, cooldown_s=3600, call_timeout_s=0.05)
    prompt = PROMPTS[0]
    tokens, _, rounds = decode(client, make_plan(prompt, 12, speculation, num_draft_tokens=2, health=health))
    assert tokens == hf_greedy(tiny_llm, prompt, 12)
    assert any("self" in r.failed for r in rounds), "each wait on the hung SSM ended as its failure"
    assert ("self", "req") in client.released
    assert_all_released(engines)


def test_a_request_cancelled_while_an_ssm_hangs_releases_every_engine(engines):
    """Cancellation reaches the request wherever it waits (here on an SSM that never answers)."""
    client = HungClient(engines, hung="self")

    async def cancel_while_drafting():
        task = asyncio.ensure_future(decode_all(client, plan(PROMPTS[0], 30, "self", num_draft_tokens=2), "gone"))
        await within(client.until(lambda c: c.waiting > 0), 30, "the request asking the hung SSM for a draft")
        assert not task.done() and len(engines["llm"].cache) == 1, "cancelled mid-request, the LLM holding its state"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(task, 30, "the cancelled request ending")
        # The clean-up is shielded from the cancellation: wait for the engines to have released.
        await within(client.until(lambda c: {("llm", "gone"), ("self", "gone")} <= set(c.release_done)), 30,
                     "every engine's release after the cancellation")
        assert client.waiting == 0, "the hung draft call was cancelled with its request"

    asyncio.run(cancel_while_drafting())
    assert {m for m, rid in client.released if rid == "gone"} == {"llm", "self"}
    assert_all_released(engines)


async def decode_all(client, p: Plan, request_id: str) -> list:
    async with aclosing(rounds_of(client, p, request_id)) as rounds:
        return [r async for r in rounds]


def test_last_round_is_flagged_so_the_stream_can_end_before_clean_up(client):
    rounds = decode(client, plan([3, 7, 1, 9, 4], 9, ssm="self", num_draft_tokens=3))[2]
    assert [r.last for r in rounds] == [False] * (len(rounds) - 1) + [True]


def test_sampled_drafts_send_logits_and_stay_reproducible(client):
    """use_draft_logits: the SSM samples with the request's parameters and its logits reach the LLM."""
    params = SamplingParams(temperature=0.9, top_p=0.95)
    p = plan([3, 7, 1, 9, 4], 12, ssm="other", num_draft_tokens=3, sampling=params, seed=5, use_draft_logits=True)
    first = decode(client, p)[0]
    ssm_calls = [r for m, r in client.calls if m == "other" and not r.stop]
    assert ssm_calls and all(r.return_generation_logits and r.sampling == params for r in ssm_calls)
    verifications = [r for m, r in client.calls if m == "llm" and r.draft]
    assert verifications and all(r.draft_logits is not None and r.draft_logits.shape[0] == len(r.draft)
                                 for r in verifications)
    assert decode(client, p, request_id="again")[0] == first, "same seed, same output"


def test_ngram_drafts_fall_back_to_the_deterministic_rule(client):
    """An SSM without logits: its draft is judged as deterministic (still exact), no draft_logits sent.
    Seed 1's sampled tokens repeat earlier ones, so the n-gram drafts (asked for logits, it has none)."""
    p = plan([3, 7, 3, 7, 3, 7, 3], 10, ssm="ngram", num_draft_tokens=3,
             sampling=SamplingParams(temperature=0.9), seed=1, use_draft_logits=True)
    first, stats, _ = decode(client, p)
    ngram_calls = [r for m, r in client.calls if m == "ngram" and not r.stop]
    assert ngram_calls and all(r.return_generation_logits for r in ngram_calls), "a sampled draft was asked for"
    llm_calls = [r for m, r in client.calls if m == "llm" and not r.stop]
    verifications = [r for r in llm_calls if r.draft]
    assert verifications and stats.draft_tokens == sum(len(r.draft) for r in verifications) > 0, (
        "the n-gram's drafts were verified")
    assert all(r.draft_logits is None for r in llm_calls), "no draft logits: the deterministic rule judged them"
    assert decode(client, p, request_id="again")[0] == first, "same seed, same output"


DEARER = 1.04
"""A draft token's verification cost, in plain steps, that no draft pays (a draft of k tokens emits at
most k + 1), by more than the float noise of the fitted costs, while the length policy, within its 5%
margin, still asks for drafts."""


def _priced(per_draft_token: float) -> SharedLengthStats:
    """A server whose measured verification of k draft tokens costs 1 + per_draft_token * k plain steps,
    and whose drafts so far were accepted whole (so that the length policy drafts 4 tokens or more: it
    prices lengths by that history, not by the draft). The costs take no more samples: the test's own
    rounds, timed on a busy machine, would move them (a slow plain step makes a draft look worth it)."""
    stats = SharedLengthStats()
    for k in range(9):
        for _ in range(4):
            stats.verify.observe(1, k, 0.01 * (1 + per_draft_token * k))
    for _ in range(50):
        stats.observe(1, False, 4, 4, None, 0.01 * (1 + per_draft_token * 4), ("ngram",))
    stats.verify.weight = 0.0
    return stats


def _decode_priced(client, prompt, per_draft_token: float, num_draft_tokens: int | None = None):
    """single:ngram, asked for its drafts' chances, on a server `_priced` so."""
    return decode(client, plan(prompt, 14, "ngram", num_draft_tokens=num_draft_tokens,
                               confident_ssms=frozenset({"ngram"}), length_stats=_priced(per_draft_token)))


def test_lookup_drafts_are_verified_only_where_their_own_chances_pay(client, engines, tiny_llm):
    """A lookup draft carries each token's learnt chance (its log probs; here the prior of a 2-token
    match, 0.5 a token), and the adaptive loop verifies the prefix with the least expected time per
    token: none where a draft token costs more than a plain step (`DEARER`: no chance, however the
    request's calibration scales it, makes a token worth that), the drafts as asked where verifying costs
    what a plain step does. A request that fixed its draft length is verified as asked. Greedy output
    is the LLM's either way."""
    prompt = PROMPTS[2]  # ends with (12, 2), which the prompt continued: prompt lookup drafts at once
    want = hf_greedy(tiny_llm, prompt, 14)
    tokens, dear, rounds = _decode_priced(client, prompt, per_draft_token=DEARER)
    assert tokens == want and dear.drafts == 0
    assert any(r.planned > 0 for r in rounds), "the length policy asked for drafts: the cut refused them"
    tokens, cheap, _ = _decode_priced(client, prompt, per_draft_token=0.0)
    assert tokens == want and cheap.drafts > 0
    tokens, fixed, _ = _decode_priced(client, prompt, per_draft_token=DEARER, num_draft_tokens=4)
    assert tokens == want and fixed.drafts > 0
    assert_all_released(engines)


def test_on_an_llm_that_does_not_stream_a_lookup_whose_drafts_are_priced_out_rests(client, engines, tiny_llm):
    """Where every lookup draft is cut to nothing (a draft token costs more than a plain step, `DEARER`: no
    draft pays, however sure, even once the request's calibration has seen its priced-out drafts come
    true), a request on an LLM that does not stream stops asking its lookup before each plain step:
    after the first empty draft, min_gap tokens (4 here) pass before the next ask, and each empty ask
    doubles the rest up to max_gap (watch.DraftRest). Greedy output is the LLM's."""
    prompt, n = PROMPTS[0], 50
    tokens, drafted, _ = decode(client, plan(prompt, n, "ngram", num_draft_tokens=None,
                                             confident_ssms=frozenset({"ngram"}), length_stats=_priced(DEARER),
                                             probe_repeat_tokens=0, probe_min_gap=4, probe_max_gap=16))
    assert tokens == hf_greedy(tiny_llm, prompt, n) and drafted.drafts == 0
    asks = [len(r.input_ids) - len(prompt) for m, r in client.calls if m == "ngram" and not r.stop]
    assert len(asks) >= 3 and asks[0] == 1, "round 2 asks"
    gaps = [b - a for a, b in zip(asks, asks[1:])]
    assert all(gap >= min(4 * 2 ** i, 16) for i, gap in enumerate(gaps)), gaps
    assert_all_released(engines)


def test_lookup_drafts_are_asked_whole_and_cut_by_their_chances(client, engines, tiny_llm):
    """The length policy drafts at most 8 tokens (its longest candidate), but a lookup that sends its
    tokens' chances is asked for the request's max_draft_tokens: its chances, not the policy's average,
    cut each draft (a long copy is worth more of its tokens). A request that fixed its draft length
    asks that many (fewer near its end)."""
    prompt = PROMPTS[2]
    want = hf_greedy(tiny_llm, prompt, 14)
    asked = lambda: max(r.request_output_len for m, r in client.calls if m == "ngram" and not r.stop)  # noqa: E731
    tokens, cheap, rounds = _decode_priced(client, prompt, per_draft_token=0.0)
    assert tokens == want and cheap.drafts > 0
    most = DEFAULTS.limits.num_draft_tokens
    assert max(r.planned for r in rounds) < most and asked() == most
    client.calls.clear()
    tokens, fixed, _ = _decode_priced(client, prompt, per_draft_token=0.0, num_draft_tokens=4)
    assert tokens == want and fixed.drafts > 0 and asked() == 4
    assert_all_released(engines)


@pytest.mark.parametrize("ssm", [None, "self"])
def test_only_a_requests_first_llm_call_asks_for_the_prompt_tokens_found_cached(client, ssm):
    """Every request reports its cached prompt tokens (an OpenAI answer's usage): its first LLM call,
    whose sequence is the prompt, asks the engine for kv_cache_reused_blocks; no later call does."""
    prompt = PROMPTS[2]
    decode(client, plan(prompt, 10, ssm, num_draft_tokens=3))
    llm = [r for model, r in client.calls if model == "llm" and not r.stop]
    assert len(llm) > 1 and llm[0].input_ids == prompt and llm[0].return_perf_metrics
    assert not any(r.return_perf_metrics for r in llm[1:])


@pytest.mark.parametrize("ssm,length", [("self", None), ("self", 3), (None, None)])
def test_every_round_is_read_as_the_pass_its_own_call_went_into(client, ssm, length):
    """The loop tells the length statistics whose rounds they observe (adaptive, fixed and plain alike),
    so that each is keyed on the batch length of the passes its call went into
    (`SharedLengthStats.pass_length`), and forgets the request when it ends."""
    asked: list[str | None] = []

    class Recording(SharedLengthStats):
        def pass_length(self, request_id: str | None, default: int) -> int:
            asked.append(request_id)
            return super().pass_length(request_id, default)

    stats = Recording()
    decode(client, plan(PROMPTS[0], 12, ssm, num_draft_tokens=length, length_stats=stats), "req-7")
    assert asked and set(asked) == {"req-7"}
    assert "req-7" not in stats.longest and "req-7" not in stats.drafting
