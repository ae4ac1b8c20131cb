"""The decode loop over a streaming LLM (the llama.cpp engine, in process): `off` is one streaming call,
plain decoding of a request that drafts streams from one call too while probes watch it, every
mode's greedy output is `off`'s, and stopping a request mid-stream ends the engine's generation and
frees its slot."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from decoding import PROMPTS, InProcessClient, decode, make_plan, rounds_of
from minions.decoding.engine_call import EngineRequest
from minions.deploy.artifacts import smollm2_gguf
from minions.engines.llamacpp_engine import LlamaCppEngine
from minions.engines.ngram_engine import NgramEngine, ngram_draft
from minions.speculation.pricing.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.loop import speculative_decode
from minions.speculation.mode import Speculation

N = 40
# Text that repeats, so prompt lookup drafts and is often right.
REPEATING = [int(t) for t in [504, 3458, 282, 253, 1345, 30, 504, 3458, 282, 253, 1345, 30, 504, 3458, 282, 253]]


@pytest.fixture(scope="module")
def llm():
    """The GGUF as deployed: batch-invariant, so a token's logits do not depend on what the module's
    earlier tests left in the engine (with F16 weights, where another prompt's sequence sat moved a near
    tie at token 17 of PROMPTS[0], and a test passed or failed by the order the tests ran in)."""
    engine = LlamaCppEngine(str(smollm2_gguf()), num_threads=1, max_sequences=4, n_ctx=512, kv_unified=False,
                            batch_invariant=True)
    yield engine
    engine.close()


@pytest.fixture
def client(llm):
    return InProcessClient({"llm": llm, "ngram": NgramEngine(max_ngram=3, min_ngram=2)})


def reference(llm: LlamaCppEngine, prompt: list[int]) -> list[int]:
    result = llm.generate(EngineRequest("ref", prompt, N))
    llm.release("ref")
    return result.tokens


@pytest.mark.parametrize("prompt", [REPEATING, PROMPTS[0]])
def test_off_is_one_streaming_call_with_plain_decoding_s_output(client, llm, prompt):
    tokens, _, rounds = decode(client, make_plan(prompt, N, llm_streams=True))
    assert tokens == reference(llm, prompt)
    assert [r.tokens for r in rounds] == [[t] for t in tokens]  # a round per streamed token
    assert [model for model, _ in client.calls] == ["llm", "llm"]  # the stream, then the release
    assert client.calls[0][1].streaming and "req" not in llm.cache


@pytest.mark.parametrize("num_draft_tokens", [None, 3])
def test_speculation_over_a_streaming_llm_keeps_off_s_output(client, llm, num_draft_tokens):
    plan = make_plan(REPEATING, N, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                     num_draft_tokens=num_draft_tokens)
    tokens, stats, _ = decode(client, plan)
    assert tokens == reference(llm, REPEATING)
    assert stats.accepted_tokens > 0 and "req" not in llm.cache


def test_plain_decoding_the_selector_chose_is_one_stream_when_probes_find_nothing(client, llm):
    """With only s = 0 to choose from and text that prompt lookup cannot draft, every token after the
    first comes from one streaming call: probes that find nothing end nothing."""
    stats = SharedLengthStats(LengthPolicy(candidates=(0,)))
    distinct = list(range(1000, 1020))
    n = 14  # the LLM's 15th token repeats a bigram of its own: from there on a probe could find a draft
    expected = reference(llm, distinct)[:n]
    assert not any(ngram_draft(distinct + expected[:i], 8, 3, 2) for i in range(n + 1)), "prompt lookup drafts"
    outcomes: list[str] = []
    plan = make_plan(distinct, n, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                     num_draft_tokens=None, length_stats=stats, probe_first_gap=1, probe_min_gap=1,
                     on_probe=outcomes.append)
    tokens, _, rounds = decode(client, plan)
    assert tokens == expected
    llm_calls = [call for model, call in client.calls if model == "llm" and not call.stop]
    assert [c.streaming for c in llm_calls] == [False, True]  # round 1, then the rest from one stream
    assert all(r.drafted == 0 for r in rounds)
    probes = [call for model, call in client.calls if model == "ngram" and len(call.input_ids) > len(distinct) + 1]
    assert probes, "the stream was probed"
    assert len(outcomes) == len(probes) and "found" not in outcomes, "each probe's outcome is told once"


def test_closing_a_request_mid_stream_ends_the_generation_and_its_sequence(client, llm):
    async def three_rounds() -> int:
        async with aclosing(rounds_of(client, make_plan(PROMPTS[2], 400, llm_streams=True), "early")) as rounds:
            seen = 0
            async for _ in rounds:
                seen += 1
                if seen == 3:
                    return seen
        return seen

    assert asyncio.run(three_rounds()) == 3
    slots = llm.stepper.slots  # its slot is free again or kept as an idle prefix, not live
    assert "early" not in llm.cache and len(slots.free) + len(slots.idle) == 4 - len(llm.cache)
    assert ("llm", "early") in client.released


def test_a_round_whose_drafters_find_nothing_streams_instead_of_a_one_token_call(client, llm):
    """Prompt lookup on text that does not repeat proposes nothing: rather than one LLM call per plain
    token, the loop streams; every LLM call after the first verifies a draft or streams."""
    distinct = list(range(1000, 1020))
    plan = make_plan(distinct, 24, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                     num_draft_tokens=3)
    tokens, _, _ = decode(client, plan)
    assert tokens == reference(llm, distinct)[:24]
    calls = [call for model, call in client.calls if model == "llm" and not call.stop]
    assert not calls[0].streaming and not calls[0].draft  # round 1: the prompt's prefill
    assert all(call.draft or call.streaming for call in calls[1:]), [(len(c.draft), c.streaming) for c in calls]
    assert any(call.streaming for call in calls[1:])


def test_a_probe_s_draft_stops_the_stream_and_is_verified(client, llm):
    """With s = 0 the only choice, a request whose text repeats still gets its prompt-lookup drafts
    verified: a probe that finds one stops the plain stream (a `stop` while it runs, the stream's
    tokens kept), and only drafts at least `probe_min_draft` long are verified."""
    stats = SharedLengthStats(LengthPolicy(candidates=(0,)), probe_min_draft=3)
    outcomes: list[str] = []
    plan = make_plan(REPEATING, N, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                     num_draft_tokens=None, length_stats=stats, probe_tokens=6, probe_min_draft=3, probe_first_gap=1,
                     probe_min_gap=1, on_probe=outcomes.append)
    tokens, stats_, _ = decode(client, plan)
    assert tokens == reference(llm, REPEATING)
    verified = [call for model, call in client.calls if model == "llm" and call.draft]
    assert verified and all(len(call.draft) >= 1 for call in verified)
    assert stats_.accepted_tokens > 0
    streams = [call for model, call in client.calls if model == "llm" and call.streaming]
    assert len(streams) >= 2, "a probe's draft ended a stream, and plain decoding went on in a new one"
    assert len(streams) - 1 <= outcomes.count("found") <= len(streams), "every stream but the last ended for a draft"
    assert ("llm", "req") in client.released[:-1], "the stream was stopped before the request ended"
    calls = [call for model, call in client.calls if model == "llm" and not call.stop]
    assert stats_.call_draft_lengths == [len(call.draft) for call in calls], "one length per call, a stream's 0 once"
    assert sum(e.count for e in stats.verify.restarts.values()) == len(streams), \
        "each stream, all after round 1's call, measured its restart (what the next probe's draft pays for)"


def test_probes_whose_drafts_the_verification_costs_price_out_say_so(client, llm):
    """A lookup that gives its tokens' chances has its probe drafts cut to what is worth verifying at
    the load: where the measured verifications cost far more than plain steps, a repeating text's
    drafts are cut to nothing, nothing is verified, and the probes end `priced_out`, not `empty`
    (a server that stopped drafting on its costs tells so in minions_probes)."""
    stats = SharedLengthStats(LengthPolicy(candidates=(0,)), probe_min_draft=3)
    for s in range(17):  # a plain step 6 ms, a verification of any draft 10 s
        stats.verify.observe(1, s, 0.006 if s == 0 else 10.0)
    outcomes: list[str] = []
    plan = make_plan(REPEATING, N, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                     num_draft_tokens=None, length_stats=stats, probe_tokens=6, probe_min_draft=3, probe_first_gap=1,
                     probe_min_gap=1, on_probe=outcomes.append, confident_ssms=frozenset({"ngram"}))
    tokens, _, _ = decode(client, plan)
    assert tokens == reference(llm, REPEATING)
    assert not [call for model, call in client.calls if model == "llm" and call.draft], "a draft was verified"
    assert "priced_out" in outcomes and "found" not in outcomes, outcomes


def test_the_llm_s_release_is_queued_first_and_told_before_the_ssms_are_released(client, llm):
    """The orchestrator hands a finished request's slot to the next one when told: by then the LLM's
    release is on its way (a later call reaches the engine behind it), the SSMs' not yet."""
    plan = make_plan(REPEATING, 8, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True)
    seen: list[list[tuple[str, str]]] = []

    async def run() -> list[int]:
        rounds = speculative_decode(client, plan.request, plan.services(), "req",
                                    lambda: seen.append(list(client.released)))
        async with aclosing(rounds):
            return [t async for r in rounds for t in r.tokens]

    assert asyncio.run(run()) == reference(llm, REPEATING)[:8]
    assert seen == [[("llm", "req")]], "told once, the LLM's release alone queued"
    assert ("ngram", "req") in client.released and "req" not in llm.cache


def test_no_probes_above_the_load_limit(client, llm):
    """Under load a probe's stop and verification cost a step every request shares: above
    probe_max_load the selector's s = 0 is plain streaming, drafters unasked."""
    stats = SharedLengthStats(LengthPolicy(candidates=(0,)), probe_min_draft=3)
    plan = make_plan(REPEATING, N, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                     num_draft_tokens=None, length_stats=stats, probe_tokens=6,
                     probe_min_draft=3, probe_max_load=4, load=lambda: 8)
    tokens, _, _ = decode(client, plan)
    assert tokens == reference(llm, REPEATING)
    assert not any(call.draft for model, call in client.calls if model == "llm")
    assert not any(model == "ngram" and not call.stop for model, call in client.calls[1:])


@pytest.mark.parametrize("load, interval", [(1, 0.1), (16, 0.2)])
def test_a_stream_started_under_load_asks_for_fewer_responses(client, llm, load, interval):
    """The streamed call's interval is the request's, or longer with more requests decoding
    (Services.stream_interval_s): 16 streams at 80 responses a second in all, 200 ms each."""
    tokens, _, _ = decode(client, make_plan(PROMPTS[0], N, llm_streams=True, stream_interval_s=0.1,
                                            load=lambda: load, llm_stream_max_responses_per_s=80.0))
    assert tokens == reference(llm, PROMPTS[0])
    assert client.calls[0][1].streaming and client.calls[0][1].stream_interval_s == pytest.approx(interval)


def test_drafting_priced_out_by_a_stall_comes_back_once_forgotten(llm):
    """A request that finds drafting too dear streams its whole output plainly from one choice, and its
    probes are gated on the same price: nothing measures drafting again. Drafts that waited 100 ms a
    token (an SSM stalled) left every later request at `off`'s speed; the price is forgotten after
    `cost_memory_rounds` rounds, and the next request drafts again."""
    stats = SharedLengthStats(LengthPolicy(cost_memory_rounds=N))
    for _ in range(stats.policy.cost_seed_samples):
        stats.observe(1, False, 4, 4, 0.4, 0.03, ("ngram",))
    drafted = []
    for _ in range(2):
        client = InProcessClient({"llm": llm, "ngram": NgramEngine(max_ngram=3, min_ngram=2)})
        plan = make_plan(REPEATING, N, Speculation.parse("single:ngram", ("ngram",)), llm_streams=True,
                         num_draft_tokens=None, length_stats=stats, confident_ssms=frozenset({"ngram"}))
        tokens, decoded, _ = decode(client, plan)
        assert tokens == reference(llm, REPEATING)
        drafted.append(decoded.draft_tokens)
    assert drafted[0] == 0 and drafted[1] > 0, drafted


def test_an_off_stream_s_steps_are_plain_steps_to_the_length_statistics(client, llm):
    """`off` reports its prompt's prefill as its work before its one call; once its first token is in,
    its steps are plain ones. Reported as the prefill the whole stream long, its steps were none of
    t(b, 0)'s, and every other request's rounds meanwhile were priced at a batch length of the prompt's."""
    stats = SharedLengthStats()
    decode(client, make_plan(list(range(1000, 1020)), N, llm_streams=True, length_stats=stats))
    assert stats.verify.measured_lengths(1) == {0: N - 1}, "every step after the first token, at length 0"
