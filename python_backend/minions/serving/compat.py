"""The `minions` model's inputs (tensorrt_llm_bls's interface) for what Minions does not do: refused
by engines/compat.py's rule unless at their neutral values, so that declaring every input of
tensorrt_llm_bls (model_repository/minions/config.pbtxt) never silently ignores a request for beam
search, LoRA and the like."""

from __future__ import annotations

from minions.engines.compat import GUIDED, LORA, ONE_SEQUENCE, PROMPT_TUNING, Neutral

UNSUPPORTED_FEATURES: dict[str, str] = {
    "decoder_text_input": "encoder-decoder models",
    "image_input": "image input", "image_bytes_input": "image input", "image_url_input": "image input",
    "video_bytes_input": "video input",
    **PROMPT_TUNING, "prompt_table_extra_id": "prompt tuning",
    "embedding_bias_words": "embedding bias", "embedding_bias_weights": "embedding bias",
    **LORA, **GUIDED,
}
"""tensorrt_llm_bls inputs for features Minions does not have: refused when given with a value (an
empty one is absent)."""

NEUTRAL_ONLY: Neutral = {
    **ONE_SEQUENCE,
    "return_generation_logits": (bool, lambda v: not v,
                                 "generation logits are not returned: send return_generation_logits false"),
}
"""tensorrt_llm_bls inputs accepted only at a neutral value (tensorrt_llm's defaults). `length_penalty`
is accepted as any value: it applies to beam search only, as in TensorRT-LLM."""

