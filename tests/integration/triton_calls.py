"""One request on Triton's own endpoints, with no client library between the test and what Triton
sends, each bounded by a deadline so that a request that never ends fails the test instead of hanging
it: the gRPC stream (every answer until the stream closes), HTTP generate and generate_stream (the
status and each JSON object of the body)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from minions.serving.inputs import INPUTS
from tests.integration.helpers import grpc_tensor, http_request

DEADLINE_S = 120.0
"""The most one request may take: every request here ends at once (refused) or within a short generation."""

GRPC_ERROR_HEADER = {"triton_grpc_error": "true"}
"""Asks Triton's gRPC stream for an error's status code: the stream closes with it (Triton 2.51)."""

_TYPES = {"TYPE_STRING": ("BYTES", np.object_), "TYPE_BOOL": ("BOOL", np.bool_), "TYPE_FP32": ("FP32", np.float32),
          "TYPE_FP16": ("FP16", np.float16), "TYPE_INT32": ("INT32", np.int32), "TYPE_UINT64": ("UINT64", np.uint64),
          "TYPE_UINT8": ("UINT8", np.uint8)}


@dataclass(frozen=True)
class Raw:
    """A tensor sent as it is, whatever the model declares (a wrong dtype or shape)."""

    array: np.ndarray
    triton_type: str


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


def tensors(inputs: Mapping[str, Any]) -> list:
    """gRPC tensors of the `minions` model's inputs from plain values: the dtype its table declares, [1, 1]
    for one value and [1, n] for a list (strings as UTF-8, a lone surrogate as its three bytes)."""
    out = []
    for name, value in inputs.items():
        if isinstance(value, Raw):
            out.append(grpc_tensor(name, value.array, value.triton_type))
            continue
        triton_type, dtype = _TYPES[INPUTS[name].data_type]
        values = value if isinstance(value, list) else [value]
        if dtype is np.object_:
            values = [_bytes(v) for v in values]
        out.append(grpc_tensor(name, np.array([values], dtype=dtype), triton_type))
    return out


def json_body(inputs: Mapping[str, Any]) -> str | None:
    """The same inputs as the JSON of HTTP generate (NaN and Infinity as Triton's parser reads them, a
    lone surrogate as its escape); None when JSON cannot carry them (bytes, a raw tensor)."""
    if any(isinstance(v, (bytes, Raw)) or (isinstance(v, list) and any(isinstance(x, bytes) for x in v))
           for v in inputs.values()):
        return None
    return json.dumps(dict(inputs))


@dataclass(frozen=True)
class StreamAnswer:
    """What one request's gRPC stream delivered before it closed."""

    results: list[dict]
    """Responses with outputs, as JSON."""
    errors: list[InferenceServerException]


def grpc_stream(url: str, request: list, headers: Mapping[str, str] | None = None, model: str = "minions",
                deadline_s: float = DEADLINE_S) -> StreamAnswer:
    """Send one request on its own stream and close the sending side: Triton ends the stream once the
    request has had its final response (or the deadline has passed, an error here)."""
    answers: list[tuple[Any, Any]] = []
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.append((result, error)), stream_timeout=deadline_s,
                        headers=dict(headers or {}))
    try:
        client.async_stream_infer(model, request, enable_empty_final_response=True)
    finally:
        client.stop_stream()  # waits for the stream to end
        client.close()
    return StreamAnswer([r.get_response(as_json=True) for r, _ in answers if r is not None],
                        [e for _, e in answers if e is not None])


def http_generate(base_url: str, body: str, stream: bool, model: str = "minions",
                  deadline_s: float = DEADLINE_S) -> tuple[int, list[dict]]:
    """POST to generate (stream false) or generate_stream: the status and the body's JSON objects, one
    per server-sent event (Triton's own refusals before the model are one plain JSON object)."""
    endpoint = "generate_stream" if stream else "generate"
    status, _, text = http_request(f"{base_url}/v2/models/{model}/{endpoint}", body.encode(), timeout=deadline_s)
    if not text.startswith("data:"):
        return status, [json.loads(text)]
    events = [event.removeprefix("data:").strip() for event in text.split("\n\n") if event.strip()]
    return status, [json.loads(event) for event in events]
