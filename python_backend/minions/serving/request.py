"""Parsing and validating the orchestrator's inputs (the tensorrt_llm_bls names, plus ours).

Input arrives as a mapping from tensor name to numpy array (the Triton adapter builds it), so the
rules here are testable without Triton. Every problem raises InvalidRequest with a message a client
can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import SamplingParams
from minions.engines.compat import check_unsupported
from minions.errors import InvalidRequest
from minions.serving.compat import NEUTRAL_ONLY, UNSUPPORTED_FEATURES
from minions.settings import OrchestratorSettings
from minions.speculation.mode import OFF, Speculation


@dataclass(frozen=True)
class GenerationRequest:
    text: str
    max_tokens: int
    stream: bool
    sampling: SamplingParams
    seed: int | None
    penalties: Penalties = NO_PENALTIES
    """Without the prompt's length, which is known once the text is tokenised (serving/flow.py)."""
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    end_id: int | None = None
    exclude_input_in_output: bool = False
    num_draft_tokens: int | None = 4
    """Fixed draft length; None: adaptive."""
    return_perf_metrics: bool = False
    return_log_probs: bool = False
    speculation: Speculation = OFF
    chat: bool = False
    use_draft_logits: bool = False
    pipeline: bool = False


def _scalar(inputs: Mapping[str, np.ndarray], name: str, kind: type, default):
    value = inputs.get(name)
    if value is None:
        return default
    arr = np.asarray(value)
    if arr.size != 1:
        raise InvalidRequest(f"input {name!r} must hold one value, got shape {list(arr.shape)}")
    item = arr.reshape(-1)[0]
    if kind is str:
        return _utf8(name, item)
    if kind is bool:
        return bool(item)
    if kind is int:
        return int(item)
    return float(item)


def _utf8(name: str, item) -> str:
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"input {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _strings(inputs: Mapping[str, np.ndarray], name: str) -> tuple[str, ...]:
    value = inputs.get(name)
    if value is None:
        return ()
    return tuple(s for s in (_utf8(name, item) for item in np.asarray(value).reshape(-1)) if s)


def parse_generation_request(inputs: Mapping[str, np.ndarray], limits: OrchestratorSettings) -> GenerationRequest:
    """Validate raw input tensors into a GenerationRequest (token-level checks come later)."""
    if "text_input" not in inputs:
        raise InvalidRequest("input 'text_input' is required")
    check_unsupported(inputs, UNSUPPORTED_FEATURES, NEUTRAL_ONLY)
    text = _scalar(inputs, "text_input", str, "")
    if not text.strip():
        raise InvalidRequest("'text_input' is empty")
    max_tokens = _scalar(inputs, "max_tokens", int, limits.default_max_tokens)
    if not 1 <= max_tokens <= limits.max_tokens_limit:
        raise InvalidRequest(f"'max_tokens' must be in [1, {limits.max_tokens_limit}], got {max_tokens}")
    temperature = _scalar(inputs, "temperature", float, 0.0)
    if not np.isfinite(temperature) or temperature < 0:
        raise InvalidRequest(f"'temperature' must be >= 0, got {temperature}")
    top_p = _scalar(inputs, "top_p", float, 1.0)
    if not (0.0 < top_p <= 1.0):
        raise InvalidRequest(f"'top_p' must be in (0, 1], got {top_p}")
    top_k = _scalar(inputs, "top_k", int, 0)
    if top_k < 0:
        raise InvalidRequest(f"'top_k' must be >= 0, got {top_k}")
    penalties = _penalties(inputs)
    if limits.llm_model_name in limits.trtllm_model_names and (penalties.presence or penalties.frequency):
        raise InvalidRequest("'presence_penalty' and 'frequency_penalty' are not served with a TensorRT-LLM verifier: "
                             "each round sends it the whole sequence, so it would count the prompt and earlier rounds "
                             "as its input (use repetition_penalty)")
    seed = _scalar(inputs, "seed", int, None)
    if seed is None:
        seed = _scalar(inputs, "random_seed", int, None)
    k = _scalar(inputs, "num_draft_tokens", int, limits.num_draft_tokens)
    if k is not None and not 0 <= k <= limits.max_num_draft_tokens:
        raise InvalidRequest(f"'num_draft_tokens' must be in [0, {limits.max_num_draft_tokens}], got {k}")
    speculation = Speculation.parse(_scalar(inputs, "speculation", str, limits.default_speculation), limits.ssm_model_names)
    if k == 0:
        speculation = OFF
    return GenerationRequest(
        text=text,
        max_tokens=max_tokens,
        stream=_scalar(inputs, "stream", bool, False),
        sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p),
        seed=seed,
        penalties=penalties,
        stop_words=_strings(inputs, "stop_words"),
        bad_words=_strings(inputs, "bad_words"),
        end_id=_scalar(inputs, "end_id", int, None),
        exclude_input_in_output=_scalar(inputs, "exclude_input_in_output", bool, False),
        num_draft_tokens=k,
        return_perf_metrics=_scalar(inputs, "return_perf_metrics", bool, False),
        return_log_probs=_scalar(inputs, "return_log_probs", bool, False),
        speculation=speculation,
        chat=_scalar(inputs, "chat", bool, limits.default_chat),
        use_draft_logits=_scalar(inputs, "use_draft_logits", bool, limits.default_use_draft_logits),
        pipeline=_scalar(inputs, "pipeline", bool, limits.pipeline),
    )


def _penalties(inputs: Mapping[str, np.ndarray]) -> Penalties:
    return Penalties(_scalar(inputs, "repetition_penalty", float, 1.0), _scalar(inputs, "presence_penalty", float, 0.0),
                     _scalar(inputs, "frequency_penalty", float, 0.0), _scalar(inputs, "min_tokens", int, 0)).checked()
