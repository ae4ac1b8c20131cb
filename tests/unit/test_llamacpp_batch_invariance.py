"""With `batch_invariant`, the llama.cpp engine computes a token's logits bit for bit the same however
its step was batched: tokens generated one a step after a 600-token prompt (where llama.cpp's CPU flash
attention would split a lone token's KV across threads, and tile the prompt's 64 query rows at a
time), and the same tokens verified as a draft, beside another sequence, after the prompt was fed in
other chunks. On the real SmolLM2 GGUF as shipped (Q4_1, whose 8-bit activations turn the other
paths' rounding into other greedy tokens: without the setting this test fails on its first row), and
re-encoded as Q4_K_M (Qwen's deployment's kind: its `ffn_down` in Q4_K, repacked at load, and Q6_K, the
other tensors in what Q4_K_M falls back to for 576 columns), which needs patches/llama-cpp-python's
k-quant-batch-invariant."""

from __future__ import annotations

import numpy as np
import pytest

from laws import batched_first_tokens, goodness_of_fit
from minions.decoding.engine_call import EngineRequest
from minions.decoding.sampling import SamplingParams, target_probs
from minions.deploy.artifacts import repacked_gguf, smollm2_gguf
from minions.engines.llamacpp_engine import (INVARIANCE_CHECK_CELLS, INVARIANCE_CHECK_TOKENS, LlamaCppEngine,
                                             LlamaCppStepper)

PROMPT_TOKENS, GENERATED = 600, 8


def _engine(gguf: str | None = None, **settings) -> LlamaCppEngine:
    return LlamaCppEngine(gguf or str(smollm2_gguf()), num_threads=2, n_ctx=1024, kv_unified=False,
                          batch_invariant=True, **settings)


@pytest.fixture(scope="module", params=["Q4_1", "Q4_K_M"])
def gguf(request, tmp_path_factory) -> str:
    """The shipped GGUF, or its Q4_K_M re-encoding (made once per run)."""
    if request.param == "Q4_1":
        return str(smollm2_gguf())
    return str(repacked_gguf(smollm2_gguf(), request.param, tmp_path_factory.mktemp("gguf")))


def test_a_tokens_logits_do_not_depend_on_how_its_step_was_batched(gguf):
    prompt = [int(t) for t in np.random.default_rng(5).integers(100, 40000, PROMPT_TOKENS)]
    alone = _engine(gguf, max_sequences=1, prefix_caching=False)
    try:  # the prompt in steps of n_batch (512, then 88), then a token a step
        own = alone.generate(EngineRequest("own", prompt, GENERATED, return_generation_logits=True))
    finally:
        alone.close()
    served = _engine(gguf, max_sequences=2)
    try:  # the prompt's first 300 tokens, then the rest and the draft in one step beside another sequence
        served.generate(EngineRequest("own", prompt[:300], 1))
        _, verified = served.generate_batch([
            EngineRequest("other", prompt[:40], 4),
            EngineRequest("own", prompt + own.tokens[:1], GENERATED, draft=own.tokens[1:],
                          return_generation_logits=True)])
    finally:
        served.close()
    # Every draft token accepted; the logits that chose each generated token after the first equal.
    assert verified.tokens[: GENERATED - 1] == own.tokens[1:]
    assert own.logits is not None and verified.logits is not None
    np.testing.assert_array_equal(verified.logits[: GENERATED - 1], own.logits[1:])


def test_the_load_time_self_check_passes_this_model_and_fails_it_without_the_setting(gguf):
    """A batch-invariant engine's warm-up checks the loaded model (LlamaCppStepper.warm_up refuses to load
    on a mismatch): tokens decoded in one step and the last few again one at a time. The same model
    without the setting (F16 K, no flash attention) fails the same check: the check can tell."""
    def stepper(invariant: bool) -> LlamaCppStepper:
        return LlamaCppStepper(gguf, num_threads=2, max_sequences=1, n_ctx=1024, draft_min_prob=0.0, n_batch=512,
                               prefix_caching=False, kv_unified=False, batch_invariant=invariant)

    check = (INVARIANCE_CHECK_CELLS, INVARIANCE_CHECK_TOKENS)
    assert stepper(True).invariance_mismatch(*check) is None
    assert "differ decoded alone" in stepper(False).invariance_mismatch(*check)


def test_sampled_verifications_batched_together_keep_each_requests_law():
    """The deployed LLM (Q4_1, batch invariant, a KV stream per sequence) verifies three sampled
    requests in each step, with drafts of 1, 2 and 3 tokens drawn from draft logits of their own (the
    min(1, p/q) rule) at T = 1, top-k 3: each request's first emitted token follows its own law, the
    top 3 of its prompt's logits computed alone (chi-square over 100 steps). A row of logits, a
    draft's logits or a seed's draws handed to another request of the step would move a law."""
    params, lengths, passes = SamplingParams(temperature=1.0, top_k=3), (1, 2, 3), 100
    prompts = [[int(t) for t in np.random.default_rng(seed).integers(100, 40000, 2 + seed)] for seed in range(3)]
    engine = _engine(max_sequences=4)
    try:
        logits = [engine.generate(EngineRequest(f"alone{i}", p, 1, return_generation_logits=True)).logits[0]
                  for i, p in enumerate(prompts)]
        laws = [target_probs(row, params) for row in logits]
        rng = np.random.default_rng(7)
        draft_logits = []
        for row, k in zip(logits, lengths):  # q: the prompt's 8 likeliest tokens, reweighted at random
            q = np.full((k, len(row)), -1e9, np.float32)
            top = np.argsort(row)[-8:]
            q[:, top] = row[top] + rng.normal(0.0, 1.0, (k, len(top)))
            draft_logits.append(q)
        steps, sequences = engine.stats.passes, engine.stats.sequences
        counts = batched_first_tokens(engine, prompts, draft_logits, params, passes, rng)
        assert engine.stats.passes - steps == passes, "one step verified the three requests each time"
        assert engine.stats.sequences - sequences == len(prompts) * passes
    finally:
        engine.close()
    for i, law in enumerate(laws):
        assert goodness_of_fit(counts[i], law) > 1e-3, i
    assert goodness_of_fit(counts[0], laws[1]) == 0.0, "the laws' supports differ: a mix-up shows"
