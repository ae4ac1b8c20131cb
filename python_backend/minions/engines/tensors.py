"""The tensor interface every engine model speaks: the one of Triton's `tensorrt_llm` model.

Because the LLM and every SSM use the same names, shapes and types as TensorRT-LLM's backend, a
TensorRT-LLM engine can replace any of them by a config change alone. This module is the pure half:
numpy arrays in, engines/api.py's dataclasses out, and back; Triton's pb_utils stays in `minions.triton`.

Both directions live here: the engine model parses requests and encodes results
(`parse_engine_inputs`, `encode_engine_outputs`); the orchestrator builds requests and decodes results
(`build_engine_inputs`, `decode_engine_outputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import SamplingParams, native_seed, request_seed
from minions.decoding.tokens import common_prefix_len
from minions.engines.compat import ENGINE_NEUTRAL_ONLY, ENGINE_UNSUPPORTED, check_unsupported
from minions.engines.sequence_cache import KV_GROWTH_TOKENS
from minions.errors import InvalidRequest
from minions.text.bad_words import BadWords

# name -> (numpy dtype, dims without the batch dimension): the inputs of tensorrt_llm/config.pbtxt the
# engines use (the others are engines/compat.py's), plus Minions' prompt_length.
ENGINE_INPUTS: dict[str, tuple[type, list[int]]] = {
    "input_ids": (np.int32, [-1]),
    "input_lengths": (np.int32, [1]),
    "request_output_len": (np.int32, [1]),
    "draft_input_ids": (np.int32, [-1]),
    "draft_logits": (np.float32, [-1, -1]),
    "end_id": (np.int32, [1]),
    "pad_id": (np.int32, [1]),
    "temperature": (np.float32, [1]),
    "runtime_top_k": (np.int32, [1]),
    "runtime_top_p": (np.float32, [1]),
    "random_seed": (np.uint64, [1]),
    "seed": (np.uint64, [1]),
    "bad_words_list": (np.int32, [2, -1]),
    "repetition_penalty": (np.float32, [1]),
    "presence_penalty": (np.float32, [1]),
    "frequency_penalty": (np.float32, [1]),
    "min_tokens": (np.int32, [1]),
    "prompt_length": (np.int32, [1]),  # ours: where the prompt ends in input_ids (penalties count the rest)
    "return_log_probs": (np.bool_, [1]),
    "return_generation_logits": (np.bool_, [1]),
    "return_perf_metrics": (np.bool_, [1]),
    "exclude_input_in_output": (np.bool_, [1]),
    "streaming": (np.bool_, [1]),  # one response per token (in-flight engines' generations)
    "stop": (np.bool_, [1]),
}

_SAMPLING = SamplingParams()
"""Sampling's defaults: what an absent input means."""


def _row(inputs: Mapping[str, np.ndarray], name: str, b: int):
    value = inputs.get(name)
    if value is None:
        return None
    arr = np.asarray(value)
    return arr[b] if arr.ndim > 0 and arr.shape[0] > b else arr


def _row_scalar(inputs: Mapping[str, np.ndarray], name: str, b: int, default):
    row = _row(inputs, name, b)
    return default if row is None or np.asarray(row).size == 0 else np.asarray(row).reshape(-1)[0].item()


def parse_engine_inputs(inputs: Mapping[str, np.ndarray], request_id: str) -> list[EngineRequest]:
    """One EngineRequest per batch row of a tensorrt_llm-style request."""
    check_unsupported(inputs, ENGINE_UNSUPPORTED, ENGINE_NEUTRAL_ONLY)
    ids = inputs.get("input_ids")
    if ids is None:
        raise InvalidRequest("input 'input_ids' is required")
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise InvalidRequest(f"'input_ids' must be [batch, len], got shape {list(ids.shape)}")
    requests = []
    for b in range(ids.shape[0]):
        length = int(_row_scalar(inputs, "input_lengths", b, ids.shape[1]))
        if not 0 < length <= ids.shape[1]:
            raise InvalidRequest(f"'input_lengths' {length} does not fit input_ids of length {ids.shape[1]}")
        draft_row = _row(inputs, "draft_input_ids", b)
        draft = [int(t) for t in np.asarray(draft_row).reshape(-1)] if draft_row is not None else []
        draft_logits = _row(inputs, "draft_logits", b)
        if draft_logits is not None:
            draft_logits = np.asarray(draft_logits, dtype=np.float32)
            if draft_logits.ndim != 2:  # whether its rows fit the draft is verify_draft's check
                raise InvalidRequest(f"'draft_logits' must be [draft length, vocab], got {list(draft_logits.shape)}")
        out_len = int(_row_scalar(inputs, "request_output_len", b, len(draft) + 1))
        if out_len < 1 and not _row_scalar(inputs, "stop", b, False):
            raise InvalidRequest(f"'request_output_len' must be >= 1, got {out_len}")
        seed = request_seed(_row_scalar(inputs, "seed", b, None), _row_scalar(inputs, "random_seed", b, None))
        end_id = _row_scalar(inputs, "end_id", b, None)
        requests.append(
            EngineRequest(
                request_id=request_id if ids.shape[0] == 1 else f"{request_id}/{b}",
                input_ids=[int(t) for t in ids[b, :length]],
                request_output_len=out_len,
                draft=draft,
                draft_logits=draft_logits,
                sampling=SamplingParams(
                    temperature=float(_row_scalar(inputs, "temperature", b, _SAMPLING.temperature)),
                    top_k=int(_row_scalar(inputs, "runtime_top_k", b, _SAMPLING.top_k)),
                    top_p=float(_row_scalar(inputs, "runtime_top_p", b, _SAMPLING.top_p)),
                ),
                seed=None if seed is None else int(seed),
                end_id=None if end_id is None else int(end_id),
                pad_id=int(_row_scalar(inputs, "pad_id", b, 0)),
                bad_words=BadWords.from_tensor(_row(inputs, "bad_words_list", b)),
                penalties=_penalties(inputs, b, length),
                return_log_probs=bool(_row_scalar(inputs, "return_log_probs", b, False)),
                return_generation_logits=bool(_row_scalar(inputs, "return_generation_logits", b, False)),
                return_perf_metrics=bool(_row_scalar(inputs, "return_perf_metrics", b, False)),
                exclude_input_in_output=bool(_row_scalar(inputs, "exclude_input_in_output", b, False)),
                streaming=bool(_row_scalar(inputs, "streaming", b, False)),
                stop=bool(_row_scalar(inputs, "stop", b, False)),
            )
        )
    return requests


def _penalties(inputs: Mapping[str, np.ndarray], b: int, length: int) -> Penalties:
    """Row b's penalties; without prompt_length all of its input_ids is the prompt."""
    penalties = Penalties(
        repetition=float(_row_scalar(inputs, "repetition_penalty", b, 1.0)),
        presence=float(_row_scalar(inputs, "presence_penalty", b, 0.0)),
        frequency=float(_row_scalar(inputs, "frequency_penalty", b, 0.0)),
        min_tokens=int(_row_scalar(inputs, "min_tokens", b, 0)),
        prompt_length=int(_row_scalar(inputs, "prompt_length", b, length)),
    ).checked()
    return NO_PENALTIES if penalties.neutral else penalties


@dataclass(frozen=True)
class CallTimes:
    """When a call arrived at the engine model and when its first and latest tokens were ready
    (time.time_ns), for tensorrt_llm's perf outputs."""

    arrival_ns: int
    first_token_ns: int
    last_token_ns: int
    generated: tuple[int, ...] | None = None
    """Tokens each row has generated so far, when a streamed response carries only the latest
    (None: the results' own tokens)."""


def encode_engine_outputs(requests: list[EngineRequest], results: list[EngineResult],
                          times: CallTimes | None = None) -> dict[str, np.ndarray]:
    """Batch the results in tensorrt_llm's layout: output_ids [batch, beam=1, len] padded with pad_id;
    the perf outputs when a request asks for them (`times` then required). A row holds its input
    first unless `exclude_input_in_output`, except a streaming call's: each of its responses holds the
    tokens made since the one before and nothing else, as TensorRT-LLM streams (its clients put the
    prompt in front themselves)."""
    rows = [r.tokens if _new_tokens_only(q) else q.input_ids + r.tokens for q, r in zip(requests, results)]
    width = max((len(r) for r in rows), default=0)
    output_ids = np.zeros((len(rows), 1, width), dtype=np.int32)
    for i, (q, row) in enumerate(zip(requests, rows)):
        output_ids[i, 0, :] = q.pad_id
        output_ids[i, 0, : len(row)] = row
    out = {
        "output_ids": output_ids,
        "sequence_length": np.array([[len(r)] for r in rows], dtype=np.int32),
        # one beam per row: the row's index in the request's batch, and sequence 0
        "batch_index": np.arange(len(rows), dtype=np.int32).reshape(-1, 1),
        "sequence_index": np.zeros((len(rows), 1), dtype=np.int32),
    }
    if any(q.return_log_probs for q in requests):
        out |= _log_prob_outputs(requests, results)
    if any(q.return_perf_metrics for q in requests):
        if times is None:
            raise ValueError("perf outputs need the call's times")
        out |= _perf_outputs(requests, results, times)
    if any(q.return_generation_logits for q in requests):
        vocab = max((r.logits.shape[-1] for r in results if r.logits is not None), default=0)
        steps = max((len(r.tokens) for r in results), default=0)
        logits = np.zeros((len(rows), 1, steps, vocab), dtype=np.float32)
        for i, r in enumerate(results):
            if r.logits is not None:
                logits[i, 0, : r.logits.shape[0], : r.logits.shape[1]] = r.logits
        out["generation_logits"] = logits
    return out


def _new_tokens_only(request: EngineRequest) -> bool:
    """Whether output_ids carry the call's new tokens alone, without its input."""
    return request.exclude_input_in_output or request.streaming


def _log_prob_outputs(requests: list[EngineRequest], results: list[EngineResult]) -> dict[str, np.ndarray]:
    """cum_log_probs [batch, beam = 1] and output_log_probs [batch, beam = 1, tokens] (zero-padded) of the
    generated tokens. InvalidRequest for an engine that has none (the n-gram and suffix drafters)."""
    steps = max((len(r.tokens) for r in results), default=0)
    output = np.zeros((len(results), 1, steps), dtype=np.float32)
    for i, (q, r) in enumerate(zip(requests, results)):
        if q.return_log_probs:
            if r.log_probs is None:
                raise InvalidRequest("this engine computes no log probabilities: send return_log_probs false")
            output[i, 0, : len(r.log_probs)] = r.log_probs
    return {"cum_log_probs": output.sum(axis=2, dtype=np.float32), "output_log_probs": output}


def _perf_outputs(requests: list[EngineRequest], results: list[EngineResult], times: CallTimes
                  ) -> dict[str, np.ndarray]:
    """tensorrt_llm's per-request perf outputs, [batch, 1] each. KV blocks are KV_GROWTH_TOKENS long:
    those the call's sequence spans, of which those it found cached (the sequence's prefix from the
    call before, or another sequence's) are reused; num_cached_tokens (ours) counts those tokens, every
    one. A draft's acceptance is its prefix the output confirms. The engine model starts every call on
    arrival, so it is scheduled when it arrives."""
    def column(values, dtype) -> np.ndarray:
        return np.array(values, dtype=dtype).reshape(-1, 1)

    generated = times.generated or [len(r.tokens) for r in results]
    spans = [-(-(len(q.input_ids) + g) // KV_GROWTH_TOKENS) for q, g in zip(requests, generated)]
    reused = [r.cached_tokens // KV_GROWTH_TOKENS for r in results]
    drafted = [len(q.draft) for q in requests]
    accepted = [common_prefix_len(q.draft, r.tokens) for q, r in zip(requests, results)]
    n = len(requests)
    return {
        "kv_cache_alloc_total_blocks": column(spans, np.int32),
        "kv_cache_reused_blocks": column(reused, np.int32),
        "num_cached_tokens": column([r.cached_tokens for r in results], np.int32),
        "kv_cache_alloc_new_blocks": column([s - u for s, u in zip(spans, reused)], np.int32),
        "arrival_time_ns": column([times.arrival_ns] * n, np.int64),
        "first_scheduled_time_ns": column([times.arrival_ns] * n, np.int64),
        "first_token_time_ns": column([times.first_token_ns] * n, np.int64),
        "last_token_time_ns": column([times.last_token_ns] * n, np.int64),
        "acceptance_rate": column([a / d if d else 0.0 for a, d in zip(accepted, drafted)], np.float32),
        "total_accepted_draft_tokens": column(accepted, np.int32),
        "total_draft_tokens": column(drafted, np.int32),
    }


OWN_INPUTS = frozenset({"random_seed", "prompt_length"})
"""Inputs our engine models take that TensorRT-LLM's tensorrt_llm model does not declare."""
OWN_OUTPUTS = frozenset({"num_cached_tokens"})
"""Outputs our engine models send that TensorRT-LLM's tensorrt_llm model does not declare."""


def build_engine_inputs(request: EngineRequest, native: bool = False) -> dict[str, np.ndarray]:
    """The inverse of parse_engine_inputs for one sequence: what the orchestrator sends an engine.
    `native`: the engine is TensorRT-LLM's own tensorrt_llm model, which knows no `prompt_length` and
    counts `min_tokens` from the call's own output, so it gets what is left of the request's, and
    restarts its generator at each call, so it gets a seed of its own per call."""
    ids = np.asarray([request.input_ids], dtype=np.int32)
    tensors = {
        "input_ids": ids,
        "input_lengths": np.array([[ids.shape[1]]], dtype=np.int32),
        "request_output_len": np.array([[request.request_output_len]], dtype=np.int32),
        "temperature": np.array([[request.sampling.temperature]], dtype=np.float32),
        "runtime_top_k": np.array([[request.sampling.top_k]], dtype=np.int32),
        "runtime_top_p": np.array([[request.sampling.top_p]], dtype=np.float32),
        "pad_id": np.array([[request.pad_id]], dtype=np.int32),
        "exclude_input_in_output": np.array([[request.exclude_input_in_output]], dtype=np.bool_),
    }
    if request.draft:
        tensors["draft_input_ids"] = np.asarray([request.draft], dtype=np.int32)
    if request.draft_logits is not None:
        tensors["draft_logits"] = np.asarray(request.draft_logits, dtype=np.float32)[None]
    if request.seed is not None:
        seed = native_seed(request.seed, len(request.input_ids)) if native else request.seed
        tensors["seed"] = np.array([[seed]], dtype=np.uint64)
    if request.end_id is not None:
        tensors["end_id"] = np.array([[request.end_id]], dtype=np.int32)
    if request.bad_words:
        tensors["bad_words_list"] = request.bad_words.to_tensor()[None]
    if not request.penalties.neutral:
        p = request.penalties
        tensors |= {
            "repetition_penalty": np.array([[p.repetition]], dtype=np.float32),
            "presence_penalty": np.array([[p.presence]], dtype=np.float32),
            "frequency_penalty": np.array([[p.frequency]], dtype=np.float32),
            "min_tokens": np.array([[p.min_tokens]], dtype=np.int32),
        }
        if native:
            generated = len(request.input_ids) - p.prompt_length
            tensors["min_tokens"] = np.array([[max(0, p.min_tokens - generated)]], dtype=np.int32)
        else:
            tensors["prompt_length"] = np.array([[p.prompt_length]], dtype=np.int32)
    if request.return_log_probs:
        tensors["return_log_probs"] = np.array([[True]], dtype=np.bool_)
    if request.return_generation_logits:
        tensors["return_generation_logits"] = np.array([[True]], dtype=np.bool_)
    if request.return_perf_metrics and not native:  # (TensorRT-LLM's own model: not asked)
        tensors["return_perf_metrics"] = np.array([[True]], dtype=np.bool_)
    if request.streaming:
        tensors["streaming"] = np.array([[True]], dtype=np.bool_)
    if request.stop:
        tensors["stop"] = np.array([[True]], dtype=np.bool_)
    return tensors


def decode_engine_outputs(request: EngineRequest, outputs: Mapping[str, np.ndarray]) -> EngineResult:
    """The inverse of encode_engine_outputs for the one sequence `request` built: the new tokens
    (output_ids up to sequence_length, past the input unless it was excluded or the call streams) and,
    when asked for, their log probs, generation logits and the input's tokens found cached
    (num_cached_tokens). `outputs` maps output names to arrays; generation_logits may be absent."""
    length = int(np.asarray(outputs["sequence_length"]).reshape(-1)[0])
    tokens = np.asarray(outputs["output_ids"]).reshape(-1)[:length]
    if not _new_tokens_only(request):
        tokens = tokens[len(request.input_ids):]
    logits = None
    generation_logits = outputs.get("generation_logits")
    if request.return_generation_logits and generation_logits is not None:
        rows = np.asarray(generation_logits)[0, 0]
        if rows.shape[-1] > 0:  # an engine without logits sends a 0-wide tensor
            logits = rows[: len(tokens)]
    log_probs = None
    if request.return_log_probs and outputs.get("output_log_probs") is not None:
        log_probs = [float(x) for x in np.asarray(outputs["output_log_probs"]).reshape(-1)[: len(tokens)]]
    found = outputs.get("num_cached_tokens")
    cached = int(np.asarray(found).reshape(-1)[0]) if found is not None else 0
    return EngineResult([int(t) for t in tokens], logits=logits, log_probs=log_probs, cached_tokens=cached)
