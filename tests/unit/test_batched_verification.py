"""Batched verification: one forward pass over several requests, each with its own KV cache.

A request's tokens and logits must not depend on what else shares its batch (greedy: identical
tokens), and the engine's KV budget must hold after every call.
"""

from __future__ import annotations

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.decoding.sampling import SamplingParams, target_probs
from minions.engines.packed_forward import ForwardRow, PackedLlamaForward, SerialForward
from minions.engines.torch_engine import TorchEngine
from minions.errors import InvalidRequest
from laws import batched_first_tokens, goodness_of_fit
from tiny_models import VOCAB, full_logits, hf_greedy, next_logits

PROMPTS = [[3, 7, 1, 9, 4], [0, 0, 5], [12, 2, 8, 8, 1, 6, 15], [4, 4]]


def test_packed_forward_matches_a_from_scratch_forward_over_ragged_rows(tiny_llm):
    packed = PackedLlamaForward(tiny_llm)
    states = [packed.new_state() for _ in PROMPTS]
    first = packed.forward([ForwardRow(s, p[:-1], 1) for s, p in zip(states, PROMPTS)])
    second = packed.forward([ForwardRow(s, p[-1:] + [1, 2][: i % 3], 1 + i % 3) for i, (s, p) in
                             enumerate(zip(states, PROMPTS))])
    for i, prompt in enumerate(PROMPTS):
        want = full_logits(tiny_llm, prompt + [1, 2][: i % 3])
        np.testing.assert_allclose(first[i][0], want[len(prompt) - 2], atol=1e-5)
        np.testing.assert_allclose(second[i], want[len(prompt) - 1 :], atol=1e-5)


def test_serial_and_packed_backends_agree(tiny_llm):
    for backend in (PackedLlamaForward(tiny_llm), SerialForward(tiny_llm)):
        states = [backend.new_state() for _ in PROMPTS]
        out = backend.forward([ForwardRow(s, p, 2) for s, p in zip(states, PROMPTS)])
        for prompt, logits, state in zip(PROMPTS, out, states):
            np.testing.assert_allclose(logits, full_logits(tiny_llm, prompt)[-2:], atol=1e-5)
            assert backend.length(state) == len(prompt)


def _drafts(tiny_llm, prompt: list[int], n: int) -> list[list[int]]:
    """Drafts of lengths 0..3 that are right, wrong at the end, or wrong at once, from HF's greedy output."""
    want = hf_greedy(tiny_llm, prompt, n + 4)
    drafts = []
    for r in range(n):
        size = r % 4
        draft = list(want[r : r + size])
        if size and r % 3 == 1:
            draft[-1] = (draft[-1] + 1) % VOCAB
        drafts.append(draft)
    return drafts


def _decode(engine: TorchEngine, batch: list[int], rounds: int, tiny_llm) -> dict[int, list[int]]:
    """Run `rounds` verification rounds for the prompts in `batch` together; each row's draft is built
    from its own greedy continuation, so rows have ragged (and sometimes empty) drafts."""
    sequences = {i: list(PROMPTS[i]) for i in batch}
    for r in range(rounds):
        requests = []
        for i in batch:
            draft = _drafts(tiny_llm, sequences[i], 1)[0] if r % 2 else []
            requests.append(EngineRequest(f"req{i}", list(sequences[i]), len(draft) + 1, draft=draft,
                                          exclude_input_in_output=True))
        for i, result in zip(batch, engine.generate_batch(requests)):
            assert not isinstance(result, Exception), result
            sequences[i] += result.tokens
    return {i: s[len(PROMPTS[i]):] for i, s in sequences.items()}


def test_greedy_output_is_the_same_alone_and_in_a_batch(tiny_llm):
    together = _decode(TorchEngine(tiny_llm, max_sequences=8), [0, 1, 2, 3], 10, tiny_llm)
    for i in range(len(PROMPTS)):
        alone = _decode(TorchEngine(tiny_llm, max_sequences=8), [i], 10, tiny_llm)
        assert together[i] == alone[i]
        assert together[i] == hf_greedy(tiny_llm, PROMPTS[i], len(together[i]))


def test_one_pass_serves_the_whole_batch_without_padding(tiny_llm):
    engine = TorchEngine(tiny_llm, max_sequences=8, min_forward_tokens=4)
    requests = [EngineRequest(f"r{i}", p, 3, draft=[1, 2]) for i, p in enumerate(PROMPTS)]
    engine.generate_batch(requests)
    assert engine.stats.passes == 1 and engine.stats.sequences == len(PROMPTS)
    assert engine.stats.pad_tokens == 0 and engine.stats.tokens == sum(len(p) + 2 for p in PROMPTS)


def test_generation_of_several_tokens_batches_step_by_step(tiny_llm):
    engine = TorchEngine(tiny_llm, max_sequences=8)
    lengths = [5, 1, 3, 2]
    results = engine.generate_batch([EngineRequest(f"r{i}", p, n) for i, (p, n) in enumerate(zip(PROMPTS, lengths))])
    for prompt, n, result in zip(PROMPTS, lengths, results):
        assert result.tokens == hf_greedy(tiny_llm, prompt, n)
    assert engine.stats.passes == max(lengths)


def test_a_bad_request_fails_alone(tiny_llm):
    engine = TorchEngine(tiny_llm, max_sequences=8, max_context=12)
    results = engine.generate_batch([
        EngineRequest("ok", PROMPTS[0], 2),
        EngineRequest("long", list(range(12)), 1),
        EngineRequest("ok", PROMPTS[1], 1),
        EngineRequest("bad-logits", PROMPTS[1], 2, draft=[1], draft_logits=np.zeros((1, 3), np.float32),
                      sampling=SamplingParams(temperature=0.7)),
    ])
    assert results[0].tokens == hf_greedy(tiny_llm, PROMPTS[0], 2)
    assert isinstance(results[1], InvalidRequest) and "exceeds" in str(results[1])
    assert results[2].tokens == hf_greedy(tiny_llm, PROMPTS[1], 1), "a second call for one sequence runs after the first"
    assert isinstance(results[3], InvalidRequest) and "draft_logits" in str(results[3])


def test_kv_budget_is_never_exceeded_and_evicted_sequences_recompute(tiny_llm):
    packed = PackedLlamaForward(tiny_llm)
    budget = 2 * packed.projected_bytes(packed.new_state(), 1)  # room for two sequences' first capacity chunk
    engine = TorchEngine(tiny_llm, max_sequences=8, kv_budget_bytes=budget)
    outputs = {}
    for r in range(6):
        i = r % len(PROMPTS)
        outputs[i] = engine.generate(EngineRequest(f"r{i}", PROMPTS[i], 3)).tokens
        assert engine.cached_bytes() <= budget
    assert engine.cache.evictions == 4 and len(engine.cache) == 2
    for i, tokens in outputs.items():
        assert tokens == hf_greedy(tiny_llm, PROMPTS[i], 3)
    too_big = engine.generate_batch([EngineRequest(f"b{i}", p, 1) for i, p in enumerate(PROMPTS)])
    assert all(isinstance(r, InvalidRequest) and "budget" in str(r) for r in too_big)
    assert engine.cached_bytes() <= budget


def test_a_release_is_not_counted_as_an_eviction(tiny_llm):
    engine = TorchEngine(tiny_llm, max_sequences=8)
    engine.generate(EngineRequest("r", PROMPTS[0], 1))
    engine.release("r")
    assert len(engine.cache) == 0 and engine.cache.evictions == 0


def test_sampled_verifications_batched_together_keep_each_requests_law(tiny_llm):
    """Three requests verified in each pass at T = 1, with drafts of 1, 2 and 3 tokens drawn from
    draft logits of their own (the min(1, p/q) rule): each request's first emitted token follows its
    own LLM law (chi-square over 1,500 passes). The prompts' laws differ, so a row of logits, a draft's
    logits or a seed's draws handed to the wrong request of the batch would move a law."""
    engine = TorchEngine(tiny_llm, max_sequences=8)
    params = SamplingParams(temperature=1.0)
    prompts, lengths, passes = PROMPTS[:3], (1, 2, 3), 1500
    laws = [target_probs(next_logits(tiny_llm, p), params) for p in prompts]
    assert min(np.abs(a - b).sum() for a, b in [(laws[0], laws[1]), (laws[1], laws[2]), (laws[0], laws[2])]) > 0.2
    rng = np.random.default_rng(5)
    draft_logits = [rng.normal(0.0, 2.0, (k, VOCAB)).astype(np.float32) for k in lengths]
    counts = batched_first_tokens(engine, prompts, draft_logits, params, passes, rng)
    assert engine.stats.passes == passes, "each pass verified the three requests together"
    for i, law in enumerate(laws):
        assert goodness_of_fit(counts[i], law) > 1e-3, i
    assert goodness_of_fit(counts[0], laws[1]) < 1e-6, "the test tells one request's law from another's"
