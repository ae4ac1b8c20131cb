"""Client library: one `generate` call over gRPC streaming, HTTP /generate or HTTP /generate_stream,
and `generate_openai` for an OpenAI-compatible chat completions API (Minions' frontend or another server).

The inputs are those of the `minions` model (tensorrt_llm_bls names plus ours); the result carries
the text, the chunks as they arrived and the timing a user wants (TTFT, tokens/s, acceptance).
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# input name -> (Triton dtype, numpy dtype, is_list)
INPUT_TYPES: dict[str, tuple[str, type, bool]] = {
    "text_input": ("BYTES", np.object_, False),
    "max_tokens": ("INT32", np.int32, False),
    "stream": ("BOOL", np.bool_, False),
    "temperature": ("FP32", np.float32, False),
    "top_p": ("FP32", np.float32, False),
    "top_k": ("INT32", np.int32, False),
    "seed": ("UINT64", np.uint64, False),
    "stop_words": ("BYTES", np.object_, True),
    "bad_words": ("BYTES", np.object_, True),
    "end_id": ("INT32", np.int32, False),
    "pad_id": ("INT32", np.int32, False),
    "exclude_input_in_output": ("BOOL", np.bool_, False),
    "num_draft_tokens": ("INT32", np.int32, False),
    "return_perf_metrics": ("BOOL", np.bool_, False),
    "speculation": ("BYTES", np.object_, False),
    "chat": ("BOOL", np.bool_, False),
    "use_draft_logits": ("BOOL", np.bool_, False),
    "pipeline": ("BOOL", np.bool_, False),
    "repetition_penalty": ("FP32", np.float32, False),
    "presence_penalty": ("FP32", np.float32, False),
    "frequency_penalty": ("FP32", np.float32, False),
    "min_tokens": ("INT32", np.int32, False),
}
LIST_OUTPUTS = ("draft_lengths",)
"""Outputs that are lists per response (the others are one value each)."""


class MinionsClientError(RuntimeError):
    """The server answered with an error (its message is kept verbatim). `status` is the transport's
    status where it carries one: the HTTP status code, or gRPC's (e.g. "StatusCode.UNAVAILABLE"); a
    decoupled model's own error inside a gRPC stream arrives without one."""

    def __init__(self, message: str, status: int | str | None = None) -> None:
        super().__init__(message)
        self.status = status


class SilentStreamError(MinionsClientError):
    """The stream fell silent for longer than the client waits; the request was cancelled."""


@dataclass
class GenerationParams:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_words: list[str] | None = None
    bad_words: list[str] | None = None
    end_id: int | None = None
    exclude_input_in_output: bool | None = True
    num_draft_tokens: int | None = None
    return_perf_metrics: bool | None = True
    speculation: str | None = None
    chat: bool | None = None
    use_draft_logits: bool | None = None
    pipeline: bool | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None

    def inputs(self, prompt: str, stream: bool) -> dict:
        values = {k: v for k, v in asdict(self).items() if v is not None}
        return {"text_input": prompt, "stream": stream, **values}


@dataclass
class Completion:
    text: str = ""
    chunks: list[str] = field(default_factory=list)
    num_output_tokens: int = 0
    num_input_tokens: int | None = None
    """The prompt's tokens, after the chat template."""
    finish_reason: str | None = None
    acceptance_rate: float | None = None
    total_accepted_draft_tokens: int | None = None
    total_draft_tokens: int | None = None
    num_rounds: int | None = None
    """Verifications and streamed plain tokens."""
    num_llm_calls: int | None = None
    """Calls to the LLM: verifications and streamed stretches."""
    num_pipelined_drafts: int | None = None
    draft_lengths: list[int] | None = None
    """The draft length chosen for each round (0 = plain decoding), when perf metrics are asked for."""
    kv_cache_reused_blocks: int | None = None
    """KV blocks of the prompt the LLM found in its prefix cache, when perf metrics are asked for."""
    num_cached_tokens: int | None = None
    """The prompt's tokens the server found in its prefix cache (`minions`' output; an OpenAI server's
    usage.prompt_tokens_details.cached_tokens)."""
    ttft_s: float | None = None
    latency_s: float = 0.0
    response_id: str | None = None
    """The answer's id (an OpenAI server's `id`, which its log names)."""

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.latency_s if self.latency_s > 0 else 0.0

    @property
    def tokens_per_llm_call(self) -> float | None:
        """Mean tokens emitted per LLM call (a verification's accepted draft tokens + the LLM's own, or a
        streamed stretch)."""
        return self.num_output_tokens / self.num_llm_calls if self.num_llm_calls else None

    @property
    def normalized_latency_s(self) -> float:
        """Latency per output token, the Minions paper's metric."""
        return self.latency_s / self.num_output_tokens if self.num_output_tokens else float("inf")

    def add(self, outputs: dict, elapsed: float, on_text: Callable[[str], None] | None = None) -> None:
        """Fold one response's outputs in; `on_text` sees each non-empty text chunk as it arrives."""
        chunk = outputs.get("text_output")
        if chunk:
            if self.ttft_s is None:
                self.ttft_s = elapsed
            self.chunks.append(chunk)
            self.text += chunk
            if on_text:
                on_text(chunk)
        for key in ("num_output_tokens", "num_input_tokens", "total_accepted_draft_tokens", "total_draft_tokens",
                    "num_rounds", "num_llm_calls", "num_pipelined_drafts", "kv_cache_reused_blocks",
                    "num_cached_tokens"):
            if outputs.get(key) is not None:
                setattr(self, key, int(outputs[key]))
        if outputs.get("acceptance_rate") is not None:
            self.acceptance_rate = float(outputs["acceptance_rate"])
        if outputs.get("finish_reason"):
            self.finish_reason = outputs["finish_reason"]
        if outputs.get("draft_lengths") is not None:
            self.draft_lengths = [int(x) for x in np.asarray(outputs["draft_lengths"]).reshape(-1)]
        self.response_id = self.response_id or outputs.get("response_id")


def _first(value):
    """Scalars arrive as 1-element lists/arrays (batch dim); take the element, decode bytes."""
    while isinstance(value, (list, tuple, np.ndarray)) and len(value) > 0:
        value = value[0]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _silent(model: str, timeout_s: float, completion: Completion) -> SilentStreamError:
    """The error for a stream that fell silent for longer than the client waits."""
    return SilentStreamError(f"no response from {model} for {timeout_s:g} s ({len(completion.chunks)} chunks "
                             "received); the request was cancelled")


# -- gRPC -------------------------------------------------------------------------------------------
def _grpc_inputs(inputs: dict):
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, value in inputs.items():
        triton_type, np_type, is_list = INPUT_TYPES[name]
        items = list(value) if is_list else [value]
        if np_type is np.object_:
            items = [v.encode("utf-8") if isinstance(v, str) else v for v in items]
        array = np.array([items], dtype=np_type)
        tensor = grpcclient.InferInput(name, list(array.shape), triton_type)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def generate_grpc(url: str, model: str, prompt: str, params: GenerationParams, stream: bool = True,
                  on_text: Callable[[str], None] | None = None, timeout_s: float = 600.0,
                  cancel_after_chunks: int | None = None) -> Completion:
    """Stream over gRPC (bidirectional stream; decoupled model). Optionally cancel after N chunks.

    `timeout_s` bounds the wait for each response, not the whole generation: a server that falls
    silent (a stub that died takes its requests' streams with it, and Triton does not end them) would
    otherwise hang the caller for good. On expiry the request is cancelled and the call raises; so is
    it when `on_text` raises (tritonclient's plain stop_stream would wait for the generation's end).
    An error response is its request's last: the stream is then closed, not cancelled (Triton 2.51 can
    keep a stream cancelled just after its error response, and the model with it: docs/operations.md)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    completion = Completion()
    start = time.perf_counter()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    failure: MinionsClientError | None = None
    try:
        client.async_stream_infer(
            model, _grpc_inputs(params.inputs(prompt, stream)), request_id=uuid.uuid4().hex,
            enable_empty_final_response=True,
        )
        while True:
            try:
                result, error = responses.get(timeout=timeout_s)
            except queue.Empty:
                client.stop_stream(cancel_requests=True)
                raise _silent(model, timeout_s, completion) from None
            if error is not None:
                failure = MinionsClientError(str(error), error.status())
                break
            response = result.get_response()
            outputs = {o.name: result.as_numpy(o.name) if o.name in LIST_OUTPUTS else _first(result.as_numpy(o.name))
                       for o in response.outputs}
            completion.add(outputs, time.perf_counter() - start, on_text)
            if cancel_after_chunks is not None and len(completion.chunks) >= cancel_after_chunks:
                client.stop_stream(cancel_requests=True)
                completion.finish_reason = "cancelled"
                break
            if response.parameters["triton_final_response"].bool_param:
                break
    except BaseException:  # the caller leaves (its on_text raised, or it was interrupted): cancel, do not wait
        client.stop_stream(cancel_requests=True)
        raise
    finally:
        completion.latency_s = time.perf_counter() - start
        client.stop_stream()
        client.close()
    if failure is not None:
        raise failure
    return completion


# -- HTTP -------------------------------------------------------------------------------------------
def _post(url: str, body: dict, timeout_s: float):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")
        try:  # a JSON body, or (generate_stream) one server-sent event
            detail = json.loads(detail.strip().removeprefix("data:")).get("error", detail)
        except json.JSONDecodeError:
            pass
        raise MinionsClientError(detail, exc.code) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):  # timed out sending: the same as waiting too long for the answer
            raise exc.reason from None
        raise


def _post_reading(url: str, body: dict, model: str, timeout_s: float, on_text: Callable[[str], None] | None,
                  outputs: Callable[[Any], Iterable[dict]]) -> Completion:
    """POST `body` and fold what `outputs` reads from the answer (one dict of outputs per response or
    event) into a Completion, timed from the request. `timeout_s` bounds each wait on the socket; on
    expiry the connection closes (which cancels the request on the server) and the call raises."""
    completion = Completion()
    start = time.perf_counter()
    try:
        with _post(url, body, timeout_s) as response:
            for chunk in outputs(response):
                completion.add(chunk, time.perf_counter() - start, on_text)
    except TimeoutError:
        raise _silent(model, timeout_s, completion) from None
    completion.latency_s = time.perf_counter() - start
    return completion


def _sse_events(response) -> Iterator[dict]:
    """The JSON events of a server-sent-event stream (OpenAI's closing `[DONE]` skipped); an event that
    carries an `error` raises it."""
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        if "error" in event:
            raise MinionsClientError(str(event["error"]))
        yield event


def generate_http(url: str, model: str, prompt: str, params: GenerationParams, stream: bool = True,
                  on_text: Callable[[str], None] | None = None, timeout_s: float = 600.0) -> Completion:
    """HTTP: /generate_stream (SSE, one event per chunk) when streaming, /generate (one JSON) otherwise.
    `timeout_s` bounds each wait on the socket (the response's start, then each event), as for gRPC."""
    base = url if url.startswith("http") else f"http://{url}"
    endpoint = f"{base}/v2/models/{model}/{'generate_stream' if stream else 'generate'}"
    read = _sse_events if stream else (lambda response: [json.loads(response.read())])
    return _post_reading(endpoint, params.inputs(prompt, stream), model, timeout_s, on_text, read)


# -- OpenAI ----------------------------------------------------------------------------------------
OPENAI_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "speculation", "num_draft_tokens",
                 "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty")
"""GenerationParams sent under their own names to /v1/chat/completions (`speculation` and the others that
OpenAI does not define are extensions of Minions' frontend; another server ignores them); `stop_words`
goes as `stop`."""


def generate_openai(url: str, model: str, prompt: str | list[dict], params: GenerationParams,
                    on_text: Callable[[str], None] | None = None, timeout_s: float = 600.0) -> Completion:
    """One user message streamed from an OpenAI-compatible server's chat completions (`url`: the API's
    base URL, as OpenAI's clients take it: http://host:port/v1; Minions' frontend, or llama-server: the
    same client measures both), read as OpenAI's clients read it: each
    event's `choices[0].delta.content`, its `finish_reason`, and the final `usage` (asked for with
    `stream_options.include_usage`). `prompt` is the user's message, or a whole conversation's messages.
    `timeout_s` bounds each wait on the socket, as for the others."""
    base = url if url.startswith("http") else f"http://{url}"
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {"model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}}
    body |= {k: v for k in OPENAI_FIELDS if (v := getattr(params, k)) is not None}
    if params.stop_words:
        body["stop"] = params.stop_words
    return _post_reading(f"{base.rstrip('/')}/chat/completions", body, model, timeout_s, on_text,
                         lambda response: map(_openai_outputs, _sse_events(response)))


def _openai_outputs(event: dict) -> dict:
    """One chat-completion chunk read as OpenAI's clients read it, under Completion's output names."""
    outputs = {"response_id": event.get("id")}
    for choice in event.get("choices") or []:
        outputs["text_output"] = (choice.get("delta") or {}).get("content")
        outputs["finish_reason"] = choice.get("finish_reason")
    if usage := event.get("usage"):
        outputs["num_output_tokens"] = usage.get("completion_tokens")
        outputs["num_input_tokens"] = usage.get("prompt_tokens")
        outputs["num_cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return outputs


def generate(
    prompt: str,
    params: GenerationParams | None = None,
    protocol: str = "grpc",
    url: str | None = None,
    model: str = "minions",
    stream: bool = True,
    on_text: Callable[[str], None] | None = None,
    timeout_s: float = 600.0,
) -> Completion:
    """One generation; `timeout_s` bounds the wait for each response (see `generate_grpc`)."""
    params = params or GenerationParams()
    if protocol == "grpc":
        return generate_grpc(url or "127.0.0.1:8001", model, prompt, params, stream, on_text, timeout_s)
    if protocol == "http":
        return generate_http(url or "127.0.0.1:8000", model, prompt, params, stream, on_text, timeout_s)
    raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
