"""The llama.cpp engine as the LLM: ragged drafts verified in one decode step, KV of rejected tokens
removed, prefix reuse, eviction, and plain decoding streamed token by token (ended early by a stop).

The real SmolLM2 GGUF, F16. llama.cpp may compute a many-token step with other kernels than a one-token
step, so a token that differs from plain decoding must be a near tie of the logits (printed)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.llamacpp_engine import LlamaCppEngine

SLOTS = 4
NEAR_TIE = 0.25
"""Logit gap below which batch-shape rounding may flip a greedy token (measured differences: <= 0.08)."""


@pytest.fixture(scope="module")
def engine(smollm2_f16_gguf):
    return LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=SLOTS, n_ctx=256)


def prompt(seed: int, length: int = 20) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 40000, length)]


def plain(engine: LlamaCppEngine, tokens: list[int], n: int) -> EngineResult:
    """Greedy plain decoding of n tokens, alone, from a fresh sequence (the reference)."""
    engine.release("plain")
    result = engine.generate(EngineRequest("plain", tokens, n, return_generation_logits=True))
    engine.release("plain")
    return result


def assert_matches_plain(tokens: list[int], reference: EngineResult) -> None:
    """`tokens` are plain greedy decoding's, up to a first difference that is a near tie."""
    for i, (got, expected) in enumerate(zip(tokens, reference.tokens)):
        if got != expected:
            row = reference.logits[i]
            gap = float(row[expected] - row[got])
            print(f"position {i}: {got} instead of {expected}, logit gap {gap:.4f}")
            assert gap < NEAR_TIE
            return


def test_a_ragged_batch_of_drafts_is_verified_in_one_step_like_plain_decoding(engine):
    prompts = [prompt(s) for s in range(3)]
    truths = [plain(engine, p, 9) for p in prompts]
    # all 6 right, wrong at position 2, wrong at position 0: ragged lengths 6, 3, 1
    drafts = [truths[0].tokens[:6], truths[1].tokens[:2] + [(truths[1].tokens[2] + 1) % 40000],
              [(truths[2].tokens[0] + 1) % 40000]]
    calls = [EngineRequest(f"v{i}", p, len(d) + 1, draft=d, return_generation_logits=True)
             for i, (p, d) in enumerate(zip(prompts, drafts))]
    before = engine.stats.passes
    results = engine.generate_batch(calls)
    assert engine.stats.passes - before == 1
    expected_lengths = [7, 3, 1]  # accepted + the LLM's own token
    for result, truth, n in zip(results, truths, expected_lengths):
        assert len(result.tokens) == n and result.logits.shape[0] == n
        assert_matches_plain(result.tokens, truth)
    for call in calls:
        engine.release(call.request_id)


def test_rejected_tokens_are_removed_and_the_sequence_goes_on_from_its_cache(engine):
    p = prompt(10)
    truth = plain(engine, p, 6)
    wrong = (truth.tokens[1] + 7) % 40000
    verdict = engine.generate(EngineRequest("c", p, 4, draft=[truth.tokens[0], wrong, 5]))
    assert verdict.tokens[0] == truth.tokens[0] and len(verdict.tokens) == 2
    entry = engine.cache.get("c")
    assert entry.tokens == p + verdict.tokens[:1]  # the rejected draft tokens' KV is gone
    tokens_before = engine.stats.tokens
    sequence = p + verdict.tokens
    rest = engine.generate(EngineRequest("c", sequence, 3))
    assert engine.stats.tokens - tokens_before == 1 + 2  # the correction token, then 2 generation steps
    assert_matches_plain(verdict.tokens + rest.tokens, truth)
    engine.release("c")


def test_an_evicted_sequence_is_recomputed_when_it_returns(engine):
    prompts = [prompt(20 + i) for i in range(SLOTS + 1)]
    first = engine.generate(EngineRequest("e0", prompts[0], 2))
    for i, p in enumerate(prompts[1:], start=1):  # SLOTS more sequences: e0 is the oldest idle one
        engine.generate(EngineRequest(f"e{i}", p, 1))
    assert "e0" not in engine.cache and len(engine.cache) == SLOTS
    again = engine.generate(EngineRequest("e0", prompts[0] + first.tokens, 2))
    assert_matches_plain(first.tokens + again.tokens, plain(engine, prompts[0], 4))
    for i in range(SLOTS + 1):
        engine.release(f"e{i}")


class Stream:
    """Collects one streaming call's answers."""

    def __init__(self) -> None:
        self.parts: list[EngineResult] = []
        self.final: EngineResult | Exception | None = None
        self.done = threading.Event()
        self.first = threading.Event()

    def __call__(self, value: EngineResult | Exception) -> None:
        if isinstance(value, EngineResult) and not value.final:
            self.parts.append(value)
            self.first.set()
            return
        self.final = value
        self.done.set()

    @property
    def tokens(self) -> list[int]:
        assert isinstance(self.final, EngineResult)
        return [t for p in [*self.parts, self.final] for t in p.tokens]


def test_streaming_plain_decoding_answers_each_token_as_it_is_made(engine):
    p = prompt(30)
    stream = Stream()
    engine.submit([(EngineRequest("s", p, 8, streaming=True), stream)])
    assert stream.done.wait(30)
    assert [len(part.tokens) for part in stream.parts] == [1] * 7 and len(stream.final.tokens) == 1
    assert stream.tokens == engine.generate(EngineRequest("s-whole", p, 8)).tokens
    engine.release("s")
    engine.release("s-whole")


def test_a_stop_ends_a_streaming_generation_at_its_next_step_and_frees_its_slot(engine):
    stream = Stream()
    engine.submit([(EngineRequest("x", prompt(40), 200, streaming=True), stream)])
    assert stream.first.wait(30)
    engine.release("x")  # returns once the stream has ended and the slot is freed
    assert stream.done.is_set() and isinstance(stream.final, EngineResult)
    assert 1 <= len(stream.tokens) < 200
    assert "x" not in engine.cache


def test_streaming_generations_and_verifications_share_steps(engine):
    """In-flight: a verification sent while a stream runs is answered within a step or two, and its
    step also carries the stream's next token."""
    stream = Stream()
    engine.submit([(EngineRequest("long", prompt(50), 40, streaming=True), stream)])
    assert stream.first.wait(30)
    p = prompt(51)
    verified = engine.generate(EngineRequest("short", p, 3, draft=[1, 2]))
    assert not stream.done.is_set() and 1 <= len(verified.tokens) <= 3
    assert stream.done.wait(60) and len(stream.tokens) == 40
    engine.release("long")
    engine.release("short")
