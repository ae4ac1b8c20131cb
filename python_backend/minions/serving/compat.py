"""Inputs for what Minions does not do, on both interfaces it speaks: tensorrt_llm_bls's (the `minions`
model) and tensorrt_llm's (every engine model). They are accepted at their neutral values (what
tensorrtllm_backend's clients send by default) and refused otherwise with a message that says what
to change.

Declaring every input of those models (model_repository/minions/config.pbtxt,
model_repository/tensorrt_llm_io.pbtxt) lets their clients talk to Minions unchanged; this module
keeps that from silently ignoring a request for beam search, context logits, LoRA and the like.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from minions.errors import InvalidRequest

Neutral = dict[str, tuple[type, Callable[[object], bool], str]]
"""Input name -> (its kind, whether a value is neutral, what to send instead)."""

_PROMPT_TUNING = {"prompt_embedding_table": "prompt tuning", "prompt_vocab_size": "prompt tuning"}
_LORA = {"lora_task_id": "LoRA adapters", "lora_weights": "LoRA adapters", "lora_config": "LoRA adapters"}
_GUIDED = {"guided_decoding_guide_type": "guided decoding", "guided_decoding_guide": "guided decoding"}

UNSUPPORTED_FEATURES: dict[str, str] = {
    "decoder_text_input": "encoder-decoder models",
    "image_input": "image input", "image_bytes_input": "image input", "image_url_input": "image input",
    "video_bytes_input": "video input",
    **_PROMPT_TUNING, "prompt_table_extra_id": "prompt tuning",
    "embedding_bias_words": "embedding bias", "embedding_bias_weights": "embedding bias",
    **_LORA, **_GUIDED,
}
"""tensorrt_llm_bls inputs for features Minions does not have: refused when given with a value (an
empty one is absent)."""

_ONE_SEQUENCE: Neutral = {
    "beam_width": (int, lambda v: v == 1, "beam search is not supported: send beam_width 1"),
    "num_return_sequences": (int, lambda v: v == 1, "one sequence per request: send num_return_sequences 1"),
    "return_context_logits": (bool, lambda v: not v,
                              "context logits are not returned: send return_context_logits false"),
}

NEUTRAL_ONLY: Neutral = {
    **_ONE_SEQUENCE,
    "return_generation_logits": (bool, lambda v: not v,
                                 "generation logits are not returned: send return_generation_logits false"),
}
"""tensorrt_llm_bls inputs accepted only at a neutral value (tensorrt_llm's defaults). `length_penalty`
is accepted as any value: it applies to beam search only, as in TensorRT-LLM."""

ENGINE_UNSUPPORTED: dict[str, str] = {
    "encoder_input_features": "encoder-decoder models", "encoder_output_lengths": "encoder-decoder models",
    "decoder_input_ids": "encoder-decoder models", "decoder_input_lengths": "encoder-decoder models",
    "cross_attention_mask": "encoder-decoder models",
    **_PROMPT_TUNING, "prompt_table_extra_ids": "prompt tuning",
    "embedding_bias": "embedding bias",
    "mrope_rotary_cos_sin": "multimodal rotary embeddings", "mrope_position_deltas": "multimodal rotary embeddings",
    **_LORA, **_GUIDED,
    "context_phase_params": "disaggregated context and generation phases",
    "lookahead_window_size": "lookahead decoding", "lookahead_ngram_size": "lookahead decoding",
    "lookahead_verification_set_size": "lookahead decoding",
    "stop_words_list": "stop words in engine models (the minions model applies `stop_words`)",
    "draft_acceptance_threshold": "threshold acceptance of drafts (verification is exact)",
}
"""tensorrt_llm inputs for features the engine models do not have: refused when given with a value."""

ENGINE_NEUTRAL_ONLY: Neutral = {
    **_ONE_SEQUENCE,
    "runtime_top_p_decay": (float, lambda v: v == 1.0, "top-p decay is not supported: send runtime_top_p_decay 1"),
    "skip_cross_attn_blocks": (bool, lambda v: not v, "encoder-decoder models are not supported: send false"),
}
"""tensorrt_llm inputs engine models accept only at a neutral value."""

ENGINE_NO_EFFECT = frozenset({
    "len_penalty", "early_stopping", "beam_search_diversity_rate",  # beam search only
    "runtime_top_p_min", "runtime_top_p_reset_ids",  # top-p decay only
    "retention_token_range_starts", "retention_token_range_ends", "retention_token_range_priorities",
    "retention_token_range_durations_ms", "retention_decode_priority", "retention_decode_duration_ms",
})
"""tensorrt_llm inputs engine models accept as any value, with no effect: what they tune (beam search,
top-p decay, KV-cache retention across requests) the engines do not do."""


def check_unsupported(inputs: Mapping[str, np.ndarray], unsupported: Mapping[str, str] = UNSUPPORTED_FEATURES,
                      neutral: Neutral = NEUTRAL_ONLY) -> None:
    """InvalidRequest for the first input asking for what Minions does not do (by default, among
    tensorrt_llm_bls's; the engine models pass ENGINE_UNSUPPORTED and ENGINE_NEUTRAL_ONLY). A batch of
    values is neutral when every value in it is."""
    for name, feature in unsupported.items():
        if name in inputs and _given(inputs[name]):
            raise InvalidRequest(f"input {name!r}: {feature} are not supported by Minions; leave it out")
    for name, (kind, is_neutral, message) in neutral.items():
        value = inputs.get(name)
        if value is None:
            continue
        for item in np.asarray(value).reshape(-1):
            if not is_neutral(kind(item)):
                raise InvalidRequest(f"input {name!r} is {kind(item)}: {message}")


def _given(value: np.ndarray) -> bool:
    """Whether a tensor holds a value: any element at all, except empty strings."""
    arr = np.asarray(value)
    if arr.dtype == np.object_ or arr.dtype.kind in "SU":
        return any(len(x) for x in arr.reshape(-1))
    return arr.size > 0
