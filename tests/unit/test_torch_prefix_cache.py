"""The torch engine's prefix cache across requests (engines/torch_engine.py, engines/stored_prefixes.py):
a finished request's KV is stored, and a new request starts from the longest prefix it shares with a
stored or live sequence. Every expectation comes from the same tiny random model computed from
scratch (transformers' generate, or a forward pass without a cache)."""

from __future__ import annotations

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest
from minions.decoding.sampling import SamplingParams
from minions.engines.packed_forward import ForwardRow, PackedLlamaForward, SerialForward
from minions.engines.torch_engine import TorchEngine
from tiny_models import full_logits, hf_greedy

PROMPT = [3, 7, 1, 9, 4, 11, 2, 8, 8, 1, 6, 15]
STORE = 1 << 24


@pytest.fixture
def engine(tiny_llm) -> TorchEngine:
    return TorchEngine(tiny_llm, max_sequences=4, prefix_cache_bytes=STORE)


def served(engine: TorchEngine, request_id: str, prompt: list[int], n: int, **kw):
    """One whole request, as the orchestrator makes it: its calls, then its release."""
    result = engine.generate(EngineRequest(request_id, prompt, n, return_generation_logits=True, **kw))
    engine.release(request_id)
    return result


def assert_from_scratch(tiny_llm, prompt: list[int], result, n: int) -> None:
    assert result.tokens == hf_greedy(tiny_llm, prompt, n)
    want = full_logits(tiny_llm, prompt + result.tokens)[len(prompt) - 1: -1]
    np.testing.assert_allclose(result.logits, want, atol=1e-4, rtol=1e-4)


def test_a_repeated_prompt_is_not_prefilled_again(engine, tiny_llm):
    first = served(engine, "a", PROMPT, 4)
    before = engine.forward_tokens
    again = served(engine, "b", PROMPT, 4)
    assert (first.cached_tokens, again.cached_tokens) == (0, len(PROMPT) - 1), \
        "every prompt token but the last (evaluated for its logits) was found"
    assert engine.forward_tokens - before == 1 + 3, "the last prompt token, then one per further token"
    assert again.tokens == first.tokens
    assert_from_scratch(tiny_llm, PROMPT, again, 4)
    assert (engine.prefix_stats.queries, engine.prefix_stats.hits) == (2 * len(PROMPT), len(PROMPT) - 1)


def test_a_conversation_s_next_turn_starts_from_the_turn_before_and_its_answer(engine, tiny_llm):
    answer = served(engine, "turn-1", PROMPT, 5).tokens
    turn2 = PROMPT + answer + [5, 0]
    result = served(engine, "turn-2", turn2, 4)
    # The first turn's last token was emitted, never computed: the rest of it was cached.
    assert result.cached_tokens == len(PROMPT) + len(answer) - 1
    assert_from_scratch(tiny_llm, turn2, result, 4)
    assert len(engine.stored) == 1, "the second turn's sequence replaced the first's, which it extends"


def test_a_stored_prefix_is_copied_for_a_shorter_input_and_taken_over_by_a_longer_one(engine, tiny_llm):
    answer = served(engine, "long", PROMPT, 4).tokens
    for n, prompt in enumerate([PROMPT[:3] + [0, 0, 5], PROMPT + [13]]):  # inputs shorter than what was stored
        result = served(engine, f"shorter-{n}", prompt, 3)
        assert result.cached_tokens == len(prompt) - 1 if n else 3
        assert_from_scratch(tiny_llm, prompt, result, 3)
        assert any(s.tokens == PROMPT + answer[:3] for s in engine.stored), "copied: the stored sequence stays"
    next_turn = PROMPT + answer + [13]
    result = engine.generate(EngineRequest("next-turn", next_turn, 3, return_generation_logits=True))
    assert result.cached_tokens == len(PROMPT) + 3
    assert_from_scratch(tiny_llm, next_turn, result, 3)
    assert not any(s.tokens == PROMPT + answer[:3] for s in engine.stored), "taken over by the longer input"


def test_a_live_sequence_lends_its_prefix_and_goes_on_unchanged(engine, tiny_llm):
    live = engine.generate(EngineRequest("live", PROMPT, 2)).tokens
    other = PROMPT[:8] + [14]
    result = served(engine, "other", other, 3)
    assert result.cached_tokens == 8
    assert_from_scratch(tiny_llm, other, result, 3)
    more = engine.generate(EngineRequest("live", PROMPT + live, 3, return_generation_logits=True))
    assert_from_scratch(tiny_llm, PROMPT + live, more, 3)


def test_a_seeded_sampled_request_neither_uses_nor_leaves_a_prefix(engine):
    served(engine, "greedy", PROMPT, 4)
    stored = len(engine.stored)
    sampled = dict(sampling=SamplingParams(temperature=1.0), seed=7)
    runs = [served(engine, f"s{i}", PROMPT, 6, **sampled) for i in range(2)]
    assert [r.cached_tokens for r in runs] == [0, 0]
    assert runs[0].tokens == runs[1].tokens
    assert len(engine.stored) == stored
    assert served(engine, "greedy-again", PROMPT, 1).cached_tokens == len(PROMPT) - 1


def test_without_prefix_caching_every_request_is_computed_from_scratch(tiny_llm):
    engine = TorchEngine(tiny_llm, max_sequences=4, prefix_caching=False, prefix_cache_bytes=STORE)
    served(engine, "a", PROMPT, 2)
    live = engine.generate(EngineRequest("live", PROMPT, 2))
    assert live.cached_tokens == 0 and len(engine.stored) == 0
    assert engine.prefix_stats.queries == 0


def test_stored_prefixes_go_before_any_live_sequence_when_the_kv_budget_is_short(tiny_llm):
    packed = PackedLlamaForward(tiny_llm)
    chunk = packed.projected_bytes(packed.new_state(), 1)
    engine = TorchEngine(tiny_llm, max_sequences=8, kv_budget_bytes=2 * chunk, prefix_cache_bytes=STORE)
    engine.generate(EngineRequest("live", [1, 2, 3], 2))
    served(engine, "done", [4, 5, 6], 2)
    assert len(engine.stored) == 1 and engine.cached_bytes() == 2 * chunk
    result = engine.generate(EngineRequest("new", [7, 8, 9], 2))
    assert result.tokens == hf_greedy(tiny_llm, [7, 8, 9], 2)
    assert len(engine.stored) == 0 and "live" in engine.cache and engine.cache.evictions == 0
    assert engine.cached_bytes() <= 2 * chunk


def test_the_warm_up_stores_nothing(engine):
    assert len(engine.stored) == 0 and engine.prefix_stats.queries == 0


@pytest.mark.parametrize("backend", [PackedLlamaForward, SerialForward])
def test_a_copied_prefix_computes_as_the_original_and_leaves_it_alone(backend, tiny_llm):
    forward = backend(tiny_llm)
    original = forward.new_state()
    forward.forward([ForwardRow(original, PROMPT, 1)])
    copy = forward.copy_prefix(original, 5)
    assert (forward.length(copy), forward.length(original)) == (5, len(PROMPT))
    rest = [0, 13, 2]
    logits = forward.forward([ForwardRow(copy, rest, len(rest))])[0]
    np.testing.assert_allclose(logits, full_logits(tiny_llm, PROMPT[:5] + rest)[5:], atol=1e-4, rtol=1e-4)
    tail = forward.forward([ForwardRow(original, [4], 1)])[0]
    np.testing.assert_allclose(tail, full_logits(tiny_llm, PROMPT + [4])[-1:], atol=1e-4, rtol=1e-4)
