"""With `batch_invariant`, the llama.cpp engine computes a token's logits bit for bit the same however
its step was batched: tokens generated one a step after a 600-token prompt (where llama.cpp's CPU flash
attention would split a lone token's KV across threads, and tile the prompt's 64 query rows at a
time), and the same tokens verified as a draft, beside another sequence, after the prompt was fed in
other chunks. On the real SmolLM2 GGUF as shipped (Q4_1, whose 8-bit activations turn the other
paths' rounding into other greedy tokens: without the setting this test fails on its first row)."""

from __future__ import annotations

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.deploy.artifacts import smollm2_gguf
from minions.engines.llamacpp_engine import LlamaCppEngine

PROMPT_TOKENS, GENERATED = 600, 8


def _engine(**settings) -> LlamaCppEngine:
    return LlamaCppEngine(str(smollm2_gguf()), num_threads=2, n_ctx=1024, kv_unified=False, batch_invariant=True,
                          **settings)


def test_a_tokens_logits_do_not_depend_on_how_its_step_was_batched():
    prompt = [int(t) for t in np.random.default_rng(5).integers(100, 40000, PROMPT_TOKENS)]
    alone = _engine(max_sequences=1, prefix_caching=False)
    try:  # the prompt in steps of n_batch (512, then 88), then a token a step
        own = alone.generate(EngineRequest("own", prompt, GENERATED, return_generation_logits=True))
    finally:
        alone.close()
    served = _engine(max_sequences=2)
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
