"""minions.engines.torch_engine: a transformers model as an engine, with a per-request prefix KV cache.

Every expectation is computed from the same tiny random model without the engine (HF generate, or a
from-scratch forward pass), never hard-coded.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest
from minions.decoding.sampling import SamplingParams
from minions.decoding.tokens import common_prefix_len
from minions.engines.torch_engine import TorchEngine
from minions.engines.torch_inflight import InflightTorchEngine
from minions.errors import InvalidRequest
from minions.text.bad_words import BadWords
from tiny_models import VOCAB, full_logits, hf_greedy

PROMPTS = [[3, 7, 1, 9, 4], [0, 0, 5], [12, 2, 8, 8, 1, 6, 15]]



def cached_tokens(engine: TorchEngine, request_id: str) -> tuple[list[int], int]:
    entry = engine.cache.get(request_id)
    return list(entry.tokens), engine.backend.length(entry.state)


@pytest.fixture
def engine(tiny_llm) -> TorchEngine:
    return TorchEngine(tiny_llm, max_sequences=4)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_equals_hf_generate(engine, tiny_llm, prompt):
    want = hf_greedy(tiny_llm, prompt, 12)
    assert engine.generate(EngineRequest("one-call", prompt, 12)).tokens == want
    sequence = list(prompt)
    for _ in range(12):  # one token per call, resending the whole sequence as the orchestrator does
        sequence += engine.generate(EngineRequest("stepwise", sequence, 1)).tokens
    assert sequence[len(prompt):] == want


def test_generation_logits_match_a_from_scratch_forward(engine, tiny_llm):
    """Cached KV must give the same logits as recomputing everything (fp32, tight tolerance)."""
    prompt = PROMPTS[0]
    engine.generate(EngineRequest("r", prompt + [1, 2], 1))  # warm the cache with a different tail
    result = engine.generate(EngineRequest("r", prompt, 4, return_generation_logits=True))
    want = full_logits(tiny_llm, prompt + result.tokens)[len(prompt) - 1 : -1]
    assert result.logits.shape == (4, VOCAB)
    np.testing.assert_allclose(result.logits, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_verifying_the_greedy_continuation_accepts_all_plus_bonus(engine, tiny_llm, prompt):
    want = hf_greedy(tiny_llm, prompt, 5)
    result = engine.generate(EngineRequest("r", prompt, 5, draft=want[:4]))
    assert result.tokens == want and accepted(result, want[:4]) == 4


def test_wrong_draft_returns_accepted_prefix_and_correction(engine, tiny_llm):
    prompt = PROMPTS[0]
    want = hf_greedy(tiny_llm, prompt, 3)
    wrong = (want[1] + 1) % VOCAB
    result = engine.generate(EngineRequest("r", prompt, 4, draft=[want[0], wrong, want[2]]))
    assert result.tokens == want[:2] and accepted(result, [want[0], wrong, want[2]]) == 1


def test_draft_is_cut_to_request_output_len(engine, tiny_llm):
    prompt = PROMPTS[1]
    want = hf_greedy(tiny_llm, prompt, 3)
    result = engine.generate(EngineRequest("r", prompt, 2, draft=want))
    assert result.tokens == want[:2] and accepted(result, want[:1]) == 1


def test_cache_is_cropped_to_prompt_plus_accepted_after_rejection(engine, tiny_llm):
    prompt = PROMPTS[2]
    want = hf_greedy(tiny_llm, prompt, 8)
    draft = [want[0], want[1], (want[2] + 3) % VOCAB, want[3]]
    result = engine.generate(EngineRequest("r", prompt, 5, draft=draft))
    assert result.tokens == want[:3] and accepted(result, draft) == 2
    tokens, kv_len = cached_tokens(engine, "r")
    assert tokens == prompt + want[:2], "KV of the rejected draft tokens must be gone"
    assert kv_len == len(tokens)

    sequence = prompt + result.tokens
    before = engine.forward_tokens
    second = engine.generate(EngineRequest("r", sequence, 4, draft=want[3:6]))
    assert engine.forward_tokens - before == 1 + 3, "only the correction token and the new draft are computed"
    assert second.tokens == want[3:7] and accepted(second, want[3:6]) == 3
    tokens, kv_len = cached_tokens(engine, "r")
    assert tokens == sequence + want[3:6] and kv_len == len(tokens)


def test_plain_generation_reuses_the_prefix(engine):
    prompt = PROMPTS[0]
    before = engine.forward_tokens
    first = engine.generate(EngineRequest("r", prompt, 3)).tokens
    assert engine.forward_tokens - before == len(prompt) + 2, "prefill, then one token per further step"
    before = engine.forward_tokens
    engine.generate(EngineRequest("r", prompt + first, 1))
    assert engine.forward_tokens - before == 1, "only the last generated token was not in the cache yet"


@pytest.mark.parametrize("other", [[3, 14, 14, 2], [6, 6], [3, 7, 1, 9, 4, 0, 5]])
def test_a_different_sequence_under_the_same_id_is_recomputed(engine, tiny_llm, other):
    """The cache is keyed by request id but trusted only as far as the tokens agree."""
    engine.generate(EngineRequest("r", PROMPTS[0] + [1, 2], 3))
    result = engine.generate(EngineRequest("r", other, 3, return_generation_logits=True))
    want = full_logits(tiny_llm, other + result.tokens)[len(other) - 1 : -1]
    np.testing.assert_allclose(result.logits, want, atol=1e-4, rtol=1e-4)
    assert result.tokens == hf_greedy(tiny_llm, other, 3)


def test_release_and_stop_free_the_entry(engine):
    engine.generate(EngineRequest("a", PROMPTS[0], 2))
    engine.generate(EngineRequest("b", PROMPTS[1], 2))
    engine.release("a")
    assert "a" not in engine.cache and "b" in engine.cache
    engine.release("a")  # twice is harmless
    assert engine.generate(EngineRequest("b", PROMPTS[1], 1, stop=True)).tokens == []
    assert len(engine.cache) == 0


def test_lru_eviction_keeps_outputs_correct(tiny_llm):
    """Three interleaved requests in a two-slot cache: evicted ones are recomputed, outputs unchanged."""
    engine = TorchEngine(tiny_llm, max_sequences=2)
    want = {i: hf_greedy(tiny_llm, p, 6) for i, p in enumerate(PROMPTS)}
    seqs = {i: list(p) for i, p in enumerate(PROMPTS)}
    for _ in range(3):
        for i in seqs:
            seqs[i] += engine.generate(EngineRequest(f"req{i}", seqs[i], 2)).tokens
            assert len(engine.cache) <= 2
    assert engine.cache.evictions > 0
    for i, p in enumerate(PROMPTS):
        assert seqs[i][len(p):] == want[i]


def test_end_id_stops_generation(engine, tiny_llm):
    prompt = PROMPTS[0]
    want = hf_greedy(tiny_llm, prompt, 10)
    end_id = want[3]
    first = want.index(end_id)
    assert engine.generate(EngineRequest("r", prompt, 10, end_id=end_id)).tokens == want[: first + 1]


def test_bad_words_are_enforced_in_generation(engine, tiny_llm):
    prompt = PROMPTS[0]
    logits = full_logits(tiny_llm, prompt)[-1]
    best, runner_up = np.argsort(-logits)[:2]
    result = engine.generate(EngineRequest("r", prompt, 1, bad_words=BadWords([[int(best)]])))
    assert result.tokens == [int(runner_up)]


def test_bad_words_agree_between_generation_and_verification(engine, tiny_llm):
    """A 12-token bad word completed across the prompt/draft boundary is banned on both paths alike
    (verification once looked at only the last 8 context tokens and let it through)."""
    prompt = PROMPTS[2] + PROMPTS[0]
    greedy = hf_greedy(tiny_llm, prompt, 3)
    bad = BadWords([prompt[-10:] + greedy[:2]])  # bans greedy[1] right after prompt + greedy[0]
    plain = engine.generate(EngineRequest("plain", prompt, 2, bad_words=bad)).tokens
    verified = engine.generate(EngineRequest("verify", prompt, 3, draft=greedy[:2], bad_words=bad))
    assert plain[0] == greedy[0] and plain[1] != greedy[1]
    assert verified.tokens == plain and accepted(verified, greedy[:2]) == 1


def test_sampling_is_reproducible_by_seed(engine):
    params = SamplingParams(temperature=1.0)
    runs = [engine.generate(EngineRequest(f"r{s}", PROMPTS[0], 8, sampling=params, seed=s)).tokens for s in (1, 1, 2)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2], "different seeds should give different samples at temperature 1"


def test_context_limit(tiny_llm):
    engine = TorchEngine(tiny_llm, max_context=16)
    with pytest.raises(InvalidRequest, match="sequence of 17 tokens exceeds the engine's context of 16"):
        engine.generate(EngineRequest("r", list(range(10)), 7))
    with pytest.raises(InvalidRequest, match="exceeds"):
        engine.generate(EngineRequest("r", list(range(10)), 1, draft=[1] * 7))
    assert engine.generate(EngineRequest("r", list(range(10)), 6)).tokens
    assert TorchEngine(tiny_llm).max_context == tiny_llm.config.max_position_embeddings


def test_padded_short_passes_give_the_same_tokens_logits_and_cache(tiny_llm):
    """min_forward_tokens pads 2-3 token passes for speed; pads must not change anything observable."""
    plain = TorchEngine(tiny_llm, max_sequences=2)
    padded = TorchEngine(tiny_llm, max_sequences=2, min_forward_tokens=4)
    prompt = [1, 5, 9, 3]
    for draft in ([7], [7, 2], [2, 11, 4]):  # 2, 3 and 4 new tokens in the verification pass
        results = []
        for engine in (plain, padded):
            engine.release("r")
            first = engine.generate(EngineRequest("r", prompt, 1, exclude_input_in_output=True)).tokens
            before = engine.stats.tokens
            verdict = engine.generate(
                EngineRequest("r", prompt + first, len(draft) + 1, draft=draft, return_generation_logits=True)
            )
            results.append((verdict, cached_tokens(engine, "r"), engine.stats.tokens - before))
        (a, cache_a, width_a), (b, cache_b, width_b) = results
        assert a.tokens == b.tokens and accepted(a, draft) == accepted(b, draft)
        np.testing.assert_allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)
        assert cache_a == cache_b
        assert width_a == len(draft) + 1 and width_b == max(4, len(draft) + 1)


def accepted(result, draft: list[int]) -> int:
    """Draft tokens the engine accepted: the prefix its output shares with the draft (the loop's own
    count, since the tensor interface returns tokens only)."""
    return common_prefix_len(result.tokens, draft)


def test_the_warm_up_at_load_leaves_no_sequence_and_counts_no_work(tiny_llm):
    """The engine generates a few tokens at load (its kernels set up before the first request, as the
    llama.cpp engines' warm-up); nothing of it may stay cached, nor count as served work."""
    engine = TorchEngine(tiny_llm, max_sequences=4)
    assert list(engine.cache.items()) == [] and engine.cached_bytes() == 0
    assert engine.stats.passes == 0 and engine.forward_tokens == 0


@pytest.fixture
def inflight(tiny_llm):
    engine = InflightTorchEngine(TorchEngine(tiny_llm, max_sequences=8), capacity=4)
    yield engine
    engine.close()


def test_in_flight_every_call_gets_what_it_gets_alone(inflight, tiny_llm):
    """Ragged generations and a verification stepped together, and more calls than the batch holds."""
    requests = [EngineRequest(f"g{i}", p, 3 + 4 * i) for i, p in enumerate(PROMPTS)]
    want = hf_greedy(tiny_llm, PROMPTS[0], 6)
    requests += [EngineRequest("v", PROMPTS[0], 4, draft=want[:3]), EngineRequest("g3", PROMPTS[1], 2)]
    results = inflight.generate_batch(requests)
    assert [r.tokens for r in results[:3]] == [hf_greedy(tiny_llm, p, 3 + 4 * i) for i, p in enumerate(PROMPTS)]
    assert results[3].tokens == want[:4] and results[4].tokens == hf_greedy(tiny_llm, PROMPTS[1], 2)
    assert inflight.stats.passes < sum(r.request_output_len for r in requests)  # steps were shared


def test_a_streaming_call_answers_its_tokens_as_they_come_then_a_final_answer(inflight, tiny_llm):
    answers = []
    done = threading.Event()

    def answer(value):
        answers.append(value)
        if not isinstance(value, Exception) and value.final:
            done.set()

    inflight.submit([(EngineRequest("s", PROMPTS[2], 6, streaming=True), answer)])
    assert done.wait(60)
    assert [t for a in answers for t in a.tokens] == hf_greedy(tiny_llm, PROMPTS[2], 6)
    assert [a.final for a in answers] == [False] * (len(answers) - 1) + [True] and len(answers) > 1


def test_in_flight_a_call_the_engine_cannot_serve_fails_alone(inflight, tiny_llm):
    too_long = EngineRequest("long", [1] * 60, 10)
    results = inflight.generate_batch([too_long, EngineRequest("ok", PROMPTS[0], 2)])
    assert isinstance(results[0], InvalidRequest) and results[1].tokens == hf_greedy(tiny_llm, PROMPTS[0], 2)
