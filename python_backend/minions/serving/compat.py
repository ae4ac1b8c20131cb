"""tensorrt_llm_bls inputs for what Minions does not do: accepted at their neutral values (what
tensorrtllm_backend's clients send by default), refused otherwise with a message that says what to change.

Declaring every input of tensorrt_llm_bls (model_repository/minions/config.pbtxt) lets its clients
talk to Minions unchanged; this module keeps that from silently ignoring a request for beam search,
a penalty, log probs, LoRA and the like, which speculative decoding here does not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from minions.errors import InvalidRequest

UNSUPPORTED_FEATURES: dict[str, str] = {
    "decoder_text_input": "encoder-decoder models",
    "image_input": "image input", "image_bytes_input": "image input", "image_url_input": "image input",
    "video_bytes_input": "video input",
    "prompt_embedding_table": "prompt tuning", "prompt_vocab_size": "prompt tuning",
    "prompt_table_extra_id": "prompt tuning",
    "embedding_bias_words": "embedding bias", "embedding_bias_weights": "embedding bias",
    "lora_task_id": "LoRA adapters", "lora_weights": "LoRA adapters", "lora_config": "LoRA adapters",
    "guided_decoding_guide_type": "guided decoding", "guided_decoding_guide": "guided decoding",
}
"""Inputs for features Minions does not have: refused when given with a value (an empty one is absent)."""

NEUTRAL_ONLY: dict[str, tuple[type, Callable[[object], bool], str]] = {
    "beam_width": (int, lambda v: v == 1, "beam search is not supported: send beam_width 1"),
    "num_return_sequences": (int, lambda v: v == 1, "one sequence per request: send num_return_sequences 1"),
    "min_tokens": (int, lambda v: v <= 1, "min_tokens above 1 is not supported: leave it out"),
    "repetition_penalty": (float, lambda v: v == 1.0, "penalties are not supported: send repetition_penalty 1.0"),
    "presence_penalty": (float, lambda v: v == 0.0, "penalties are not supported: send presence_penalty 0"),
    "frequency_penalty": (float, lambda v: v == 0.0, "penalties are not supported: send frequency_penalty 0"),
    "return_log_probs": (bool, lambda v: not v, "log probs are not returned: send return_log_probs false"),
    "return_context_logits": (bool, lambda v: not v,
                              "context logits are not returned: send return_context_logits false"),
    "return_generation_logits": (bool, lambda v: not v,
                                 "generation logits are not returned: send return_generation_logits false"),
}
"""Inputs accepted only at a neutral value (tensorrt_llm's defaults). `length_penalty` is accepted as
any value: it applies to beam search only, as in TensorRT-LLM."""


def check_unsupported(inputs: Mapping[str, np.ndarray]) -> None:
    """InvalidRequest for the first input asking for what Minions does not do."""
    for name, feature in UNSUPPORTED_FEATURES.items():
        if name in inputs and _given(inputs[name]):
            raise InvalidRequest(f"input {name!r}: {feature} are not supported by Minions; leave it out")
    for name, (kind, neutral, message) in NEUTRAL_ONLY.items():
        value = inputs.get(name)
        if value is None or np.asarray(value).size == 0:
            continue
        item = kind(np.asarray(value).reshape(-1)[0])
        if np.asarray(value).size != 1 or not neutral(item):
            raise InvalidRequest(f"input {name!r} is {item}: {message}")


def _given(value: np.ndarray) -> bool:
    """Whether a tensor holds a value: any element at all, except empty strings."""
    arr = np.asarray(value)
    if arr.dtype == np.object_ or arr.dtype.kind in "SU":
        return any(len(x) for x in arr.reshape(-1))
    return arr.size > 0
