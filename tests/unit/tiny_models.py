"""Tiny random Llama models for the unit tests, and reference logits computed without any cache."""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 16


def make_tiny_llama(seed: int, logit_scale: float = 8.0):
    """A random 2-layer LlamaForCausalLM (vocab 16, fp32) with lm_head scaled so distributions are peaked.

    No special tokens are configured, so model.generate never stops early on an EOS id.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def full_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits of every position of `tokens`, computed from scratch (no cache): the reference."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


def next_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits predicting the token after `tokens`."""
    return full_logits(model, tokens)[-1]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The reference: transformers' own greedy decoding."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n, do_sample=False,
        )
    return out[0, len(prompt):].tolist()
