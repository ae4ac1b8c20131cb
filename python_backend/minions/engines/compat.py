"""Inputs of tensorrt_llm's interface (every engine model) for what the engines do not do, and the
rule that refuses them. They are accepted at their neutral values (what tensorrtllm_backend's clients
send by default) and refused otherwise with a message that says what to change.

Declaring every input of tensorrt_llm (model_repository/tensorrt_llm_io.pbtxt) lets its clients talk
to the engine models unchanged; these tables keep that from silently ignoring a request for beam
search, context logits, LoRA and the like. serving/compat.py holds the `minions` model's tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from minions.errors import InvalidRequest

Neutral = dict[str, tuple[type, Callable[[object], bool], str]]
"""Input name -> (its kind, whether a value is neutral, what to send instead)."""

PROMPT_TUNING = {"prompt_embedding_table": "prompt tuning", "prompt_vocab_size": "prompt tuning"}
LORA = {"lora_task_id": "LoRA adapters", "lora_weights": "LoRA adapters", "lora_config": "LoRA adapters"}
GUIDED = {"guided_decoding_guide_type": "guided decoding", "guided_decoding_guide": "guided decoding"}

ONE_SEQUENCE: Neutral = {
    "beam_width": (int, lambda v: v == 1, "beam search is not supported: send beam_width 1"),
    "num_return_sequences": (int, lambda v: v == 1, "one sequence per request: send num_return_sequences 1"),
    "return_context_logits": (bool, lambda v: not v,
                              "context logits are not returned: send return_context_logits false"),
}

ENGINE_UNSUPPORTED: dict[str, str] = {
    "encoder_input_features": "encoder-decoder models", "encoder_output_lengths": "encoder-decoder models",
    "decoder_input_ids": "encoder-decoder models", "decoder_input_lengths": "encoder-decoder models",
    "cross_attention_mask": "encoder-decoder models",
    **PROMPT_TUNING, "prompt_table_extra_ids": "prompt tuning",
    "embedding_bias": "embedding bias",
    "mrope_rotary_cos_sin": "multimodal rotary embeddings", "mrope_position_deltas": "multimodal rotary embeddings",
    **LORA, **GUIDED,
    "context_phase_params": "disaggregated context and generation phases",
    "lookahead_window_size": "lookahead decoding", "lookahead_ngram_size": "lookahead decoding",
    "lookahead_verification_set_size": "lookahead decoding",
    "stop_words_list": "stop words in engine models (the minions model applies `stop_words`)",
    "draft_acceptance_threshold": "threshold acceptance of drafts (verification is exact)",
}
"""tensorrt_llm inputs for features the engine models do not have: refused when given with a value."""

ENGINE_NEUTRAL_ONLY: Neutral = {
    **ONE_SEQUENCE,
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


def check_unsupported(inputs: Mapping[str, np.ndarray], unsupported: Mapping[str, str], neutral: Neutral) -> None:
    """InvalidRequest for the first input asking for what Minions does not do: one given a value among
    `unsupported`, or one among `neutral` not at its neutral value (a batch of values is neutral when
    every value in it is). The engine models pass this module's tables; the `minions` model,
    serving/compat.py's."""
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
