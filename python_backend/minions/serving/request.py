"""Parsing and validating the orchestrator's inputs (the tensorrt_llm_bls names, plus ours), with the
defaults and checks of inputs.py's table.

Input arrives as a mapping from tensor name to numpy array (the Triton adapter builds it), so the
rules here are testable without Triton. Every problem raises InvalidRequest with a message a client
can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import SamplingParams, request_seed
from minions.engines.compat import check_unsupported
from minions.errors import InvalidRequest
from minions.serving.compat import NEUTRAL_ONLY, UNSUPPORTED_FEATURES
from minions.serving.inputs import SERVED
from minions.settings import OrchestratorSettings
from minions.speculation.mode import OFF, Speculation
from minions.text.surrogates import encoded_surrogate, surrogate_message


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """A parsed request; every field is set by the parser, from the input or its default in inputs.py."""

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
    num_draft_tokens: int | None
    """Fixed draft length; None: adaptive."""
    return_perf_metrics: bool = False
    return_log_probs: bool = False
    speculation: Speculation
    chat: bool
    use_draft_logits: bool
    pipeline: bool


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
    """One BYTES value as text: InvalidRequest for bytes that are not UTF-8, and for a lone UTF-16
    surrogate (spelt `"\\udc00"` in JSON, Triton's HTTP frontend passes it on as bytes), which the
    tokenizer cannot take."""
    if isinstance(item, str):
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequest(surrogate_message(f"input {name!r}", exc.start)) from None
        return item
    raw = bytes(item)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if (index := encoded_surrogate(raw)) is not None:
            raise InvalidRequest(surrogate_message(f"input {name!r}", index)) from None
        raise InvalidRequest(f"input {name!r} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _strings(inputs: Mapping[str, np.ndarray], name: str, limits: OrchestratorSettings) -> tuple[str, ...]:
    """A list input's non-empty strings, checked by its inputs.py check."""
    value = inputs.get(name)
    if value is None:
        return ()
    strings = tuple(s for s in (_utf8(name, item) for item in np.asarray(value).reshape(-1)) if s)
    check = SERVED[name].check
    if check is not None and (problem := check(strings, limits)):
        raise InvalidRequest(problem)
    return strings


def _value(inputs: Mapping[str, np.ndarray], name: str, limits: OrchestratorSettings):
    """An input's value, or its default (inputs.py), checked against the deployment's limits."""
    spec = SERVED[name]
    value = _scalar(inputs, name, spec.kind, spec.default(limits))
    problem = spec.check(value, limits) if spec.check is not None and value is not None else None
    if problem:
        raise InvalidRequest(problem)
    return value


def parse_generation_request(inputs: Mapping[str, np.ndarray], limits: OrchestratorSettings) -> GenerationRequest:
    """Validate raw input tensors into a GenerationRequest (token-level checks come later)."""
    if "text_input" not in inputs:
        raise InvalidRequest("input 'text_input' is required")
    check_unsupported(inputs, UNSUPPORTED_FEATURES, NEUTRAL_ONLY)
    value = lambda name: _value(inputs, name, limits)  # noqa: E731
    text, max_tokens = value("text_input"), value("max_tokens")
    sampling = SamplingParams(temperature=value("temperature"), top_k=value("top_k"), top_p=value("top_p"))
    penalties = Penalties(value("repetition_penalty"), value("presence_penalty"), value("frequency_penalty"),
                          value("min_tokens")).checked()
    if limits.llm_model_name in limits.trtllm_model_names and (penalties.presence or penalties.frequency):
        raise InvalidRequest("'presence_penalty' and 'frequency_penalty' are not served with a TensorRT-LLM verifier: "
                             "each round sends it the whole sequence, so it would count the prompt and earlier rounds "
                             "as its input (use repetition_penalty)")
    k = value("num_draft_tokens")
    speculation = OFF if k == 0 else Speculation.parse(value("speculation"), limits.ssm_model_names)
    return GenerationRequest(
        text=text,
        max_tokens=max_tokens,
        stream=value("stream"),
        sampling=sampling,
        seed=request_seed(value("seed"), value("random_seed")),
        penalties=penalties,
        stop_words=_strings(inputs, "stop_words", limits),
        bad_words=_strings(inputs, "bad_words", limits),
        end_id=value("end_id"),
        exclude_input_in_output=value("exclude_input_in_output"),
        num_draft_tokens=k,
        return_perf_metrics=value("return_perf_metrics"),
        return_log_probs=value("return_log_probs"),
        speculation=speculation,
        chat=value("chat"),
        use_draft_logits=value("use_draft_logits"),
        pipeline=value("pipeline"),
    )
