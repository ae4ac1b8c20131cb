"""The `minions` model's inputs, one table: name, Triton type and dims, where the default comes from,
and the check a value must pass, as tensorrtllm_backend's triton_decoder.py keeps its input names.

The request parser (request.py) reads defaults and checks from here, the renderer writes the
config.pbtxt `input` block from here (`pbtxt_inputs`), and tests hold docs/api.md to it. Defaults
come from the deployment's settings or from decoding's own defaults, never from a literal here.
Inputs of tensorrt_llm_bls for what Minions does not do are declared too (clients send them), and
refused unless neutral by serving/compat.py's tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from minions.decoding.penalties import NO_PENALTIES
from minions.decoding.sampling import SamplingParams
from minions.settings import OrchestratorSettings

Default = Callable[[OrchestratorSettings], Any]
Check = Callable[[Any, OrchestratorSettings], str | None]
"""A value's problem as the client's message (None: fine); a list input's value is the tuple of its
non-empty strings."""

_SAMPLING = SamplingParams()


@dataclass(frozen=True)
class Input:
    name: str
    data_type: str
    """Triton's TYPE_* name."""
    dims: tuple[int, ...] = (1,)
    default: Default = lambda _: None
    """The value when the request leaves the input out (None: absent)."""
    setting: str = ""
    """The OrchestratorSettings field the default comes from, when it is the deployment's."""
    check: Check | None = None

    @property
    def kind(self) -> type:
        """The Python type of one value."""
        return {"TYPE_STRING": str, "TYPE_BOOL": bool, "TYPE_FP32": float, "TYPE_FP16": float}.get(self.data_type, int)


def _setting(name: str) -> Default:
    return lambda settings: getattr(settings, name)


def _in(low: float, high: Callable[[OrchestratorSettings], float], name: str) -> Check:
    return lambda v, s: None if low <= v <= high(s) else f"'{name}' must be in [{low}, {high(s)}], got {v}"


def _finite_at_least_zero(v, _s) -> str | None:
    return None if np.isfinite(v) and v >= 0 else f"'temperature' must be >= 0, got {v}"


def _stop_limits(stops: tuple[str, ...], s: OrchestratorSettings) -> str | None:
    """Each stop string is matched against the text at every token, at a cost that grows with the
    square of its length: their number and length are bounded (empty strings are dropped first)."""
    if len(stops) > s.limits.stop_strings:
        return (f"'stop_words' may hold at most {s.limits.stop_strings} stop strings (max_stop_strings), "
                f"got {len(stops)}")
    if (longest := max(map(len, stops), default=0)) > s.limits.stop_chars:
        return (f"'stop_words': a stop string may hold at most {s.limits.stop_chars} characters (max_stop_chars), "
                f"got one of {longest}")
    return None


_SERVED = [
    Input("text_input", "TYPE_STRING", check=lambda v, _s: None if v.strip() else "'text_input' is empty"),
    Input("max_tokens", "TYPE_INT32", default=_setting("default_max_tokens"), setting="default_max_tokens",
          check=_in(1, lambda s: s.limits.tokens_limit, "max_tokens")),
    Input("stream", "TYPE_BOOL", default=lambda _: False),
    Input("temperature", "TYPE_FP32", default=lambda _: _SAMPLING.temperature, check=_finite_at_least_zero),
    Input("top_p", "TYPE_FP32", default=lambda _: _SAMPLING.top_p,
          check=lambda v, _s: None if 0.0 < v <= 1.0 else f"'top_p' must be in (0, 1], got {v}"),
    Input("top_k", "TYPE_INT32", default=lambda _: _SAMPLING.top_k,
          check=lambda v, _s: None if v >= 0 else f"'top_k' must be >= 0, got {v}"),
    Input("seed", "TYPE_UINT64"),
    Input("random_seed", "TYPE_UINT64"),
    Input("stop_words", "TYPE_STRING", (-1,), check=_stop_limits),
    Input("bad_words", "TYPE_STRING", (-1,)),
    Input("end_id", "TYPE_INT32"),
    Input("pad_id", "TYPE_INT32"),
    Input("exclude_input_in_output", "TYPE_BOOL", default=lambda _: False),
    Input("num_draft_tokens", "TYPE_INT32", default=_setting("num_draft_tokens"), setting="default_num_draft_tokens",
          check=lambda v, s: None if v is None or 0 <= v <= s.limits.num_draft_tokens
          else f"'num_draft_tokens' must be in [0, {s.limits.num_draft_tokens}], got {v}"),
    Input("return_perf_metrics", "TYPE_BOOL", default=lambda _: False),
    Input("speculation", "TYPE_STRING", default=_setting("default_speculation"), setting="default_speculation"),
    Input("chat", "TYPE_BOOL", default=_setting("default_chat"), setting="default_chat"),
    Input("use_draft_logits", "TYPE_BOOL", default=_setting("default_use_draft_logits"),
          setting="default_use_draft_logits"),
    Input("pipeline", "TYPE_BOOL", default=_setting("pipeline"), setting="pipeline"),
    Input("repetition_penalty", "TYPE_FP32", default=lambda _: NO_PENALTIES.repetition),
    Input("min_tokens", "TYPE_INT32", default=lambda _: NO_PENALTIES.min_tokens),
    Input("presence_penalty", "TYPE_FP32", default=lambda _: NO_PENALTIES.presence),
    Input("frequency_penalty", "TYPE_FP32", default=lambda _: NO_PENALTIES.frequency),
    Input("return_log_probs", "TYPE_BOOL", default=lambda _: False),
]
"""The inputs Minions serves (penalties are range-checked by Penalties.checked)."""

_DECLARED_ONLY = [
    Input("decoder_text_input", "TYPE_STRING"),
    Input("image_input", "TYPE_FP16", (-1, 3, -1, -1)),
    Input("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1)),
    Input("image_url_input", "TYPE_STRING"),
    Input("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1)),
    Input("length_penalty", "TYPE_FP32"),
    Input("return_context_logits", "TYPE_BOOL"),
    Input("return_generation_logits", "TYPE_BOOL"),
    Input("num_return_sequences", "TYPE_INT32"),
    Input("beam_width", "TYPE_INT32"),
    Input("prompt_embedding_table", "TYPE_FP16", (-1, -1)),
    Input("prompt_vocab_size", "TYPE_INT32"),
    Input("prompt_table_extra_id", "TYPE_UINT64"),
    Input("embedding_bias_words", "TYPE_STRING", (-1,)),
    Input("embedding_bias_weights", "TYPE_FP32", (-1,)),
    Input("lora_task_id", "TYPE_UINT64"),
    Input("lora_weights", "TYPE_FP16", (-1, -1)),
    Input("lora_config", "TYPE_INT32", (-1, 3)),
    Input("guided_decoding_guide_type", "TYPE_STRING"),
    Input("guided_decoding_guide", "TYPE_STRING"),
]
"""tensorrt_llm_bls inputs declared so its clients work unchanged: `length_penalty` has no effect
(beam search only, as in TensorRT-LLM); the others are refused unless neutral (serving/compat.py)."""

SERVED: dict[str, Input] = {i.name: i for i in _SERVED}
INPUTS: dict[str, Input] = {i.name: i for i in _SERVED + _DECLARED_ONLY}


def pbtxt_inputs() -> str:
    """The config.pbtxt `input [...]` block: every input, all but `text_input` optional."""
    blocks = []
    for i in INPUTS.values():
        optional = "" if i.name == "text_input" else "\n    optional: true"
        dims = ", ".join(str(d) for d in i.dims)
        blocks.append(f'  {{\n    name: "{i.name}"\n    data_type: {i.data_type}\n    dims: [ {dims} ]{optional}\n  }}')
    return "input [\n" + ",\n".join(blocks) + "\n]"
