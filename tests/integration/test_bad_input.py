"""Bad input gets a clear error, and the server keeps serving the next good request."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.api import GenerationParams, MinionsClientError, generate_grpc
from tests.integration.helpers import grpc_tensor, http_post

BAD_HTTP_BODIES = {
    "empty prompt": ({"text_input": ""}, "'text_input' is empty"),
    "max_tokens zero": ({"text_input": "hi", "max_tokens": 0}, "'max_tokens' must be in [1,"),
    "max_tokens negative": ({"text_input": "hi", "max_tokens": -5}, "'max_tokens' must be in [1,"),
    "max_tokens above limit": ({"text_input": "hi", "max_tokens": 100000}, "'max_tokens' must be in [1, 1024]"),
    "temperature negative": ({"text_input": "hi", "temperature": -0.5}, "'temperature' must be >= 0"),
    "top_p zero": ({"text_input": "hi", "top_p": 0.0}, "'top_p' must be in (0, 1]"),
    "top_p above one": ({"text_input": "hi", "top_p": 1.5}, "'top_p' must be in (0, 1]"),
    "unknown ssm": ({"text_input": "hi", "speculation": "single:ssm_nope"}, "unknown SSM 'ssm_nope'"),
    "unknown mode": ({"text_input": "hi", "speculation": "magic"}, "unknown speculation 'magic'"),
    "too many draft tokens": ({"text_input": "hi", "num_draft_tokens": 99}, "'num_draft_tokens' must be in [0, 16]"),
    "prompt longer than context": ({"text_input": "word " * 3000}, "the context holds 2048"),
    "no chat messages": ({"text_input": "[]", "chat": True}, "empty list of messages"),
    "chat content null": ({"text_input": '[{"role": "user", "content": null}]', "chat": True},
                          "content of type NoneType: content must be a string"),
    "chat content a list": ({"text_input": '[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]',
                             "chat": True}, "content of type list"),
    "end_id negative": ({"text_input": "hi", "end_id": -1}, "'end_id' must be a token id in [0, 49151], got -1"),
    "end_id beyond the vocabulary": ({"text_input": "hi", "end_id": 999999}, "got 999999"),
}


def _good_request_works(server) -> None:
    ok = generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True))
    assert ok.num_output_tokens > 0 and ok.text


@pytest.mark.parametrize("case", list(BAD_HTTP_BODIES))
def test_bad_http_request_gets_a_400_with_a_clear_message(server, case):
    body, message = BAD_HTTP_BODIES[case]
    status, text = http_post(f"{server.http_url}/v2/models/minions/generate", body)
    assert status == 400, text
    error = json.loads(text)["error"]
    assert message in error
    _good_request_works(server)


def test_wrong_json_type_is_rejected_by_triton_before_the_model(server):
    """Triton's generate endpoint parses JSON itself and answers 500 (not 400) on a type mismatch;
    the message still says what is wrong, and the server keeps serving."""
    status, text = http_post(f"{server.http_url}/v2/models/minions/generate", {"text_input": "hi", "max_tokens": "ten"})
    assert status in (400, 500)
    assert "Unable to parse" in json.loads(text)["error"]
    _good_request_works(server)


def test_two_prompts_in_one_request_are_refused_by_triton(server):
    """One prompt per request (tensorrt_llm_bls's shape); Triton refuses a list before the model."""
    status, text = http_post(f"{server.http_url}/v2/models/minions/generate",
                             {"text_input": ["a", "b"], "max_tokens": 4})
    assert status == 400 and "batch size does not match" in json.loads(text)["error"], text
    _good_request_works(server)


def test_stream_true_on_generate_points_to_generate_stream(server):
    """Triton's /generate takes exactly one response and cannot tell the model which endpoint was
    called (its parameters and requested outputs are the same): the error comes from Triton, after the
    generation, and names the endpoint to use (docs/api.md)."""
    status, text = http_post(f"{server.http_url}/v2/models/minions/generate",
                             {"text_input": "hi", "max_tokens": 4, "stream": True})
    assert "use generate stream" in json.loads(text)["error"], (status, text)
    _good_request_works(server)


def _grpc_infer(server, tensors):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        client.async_stream_infer("minions", tensors)
    finally:
        client.stop_stream()  # waits for the stream to end
        client.close()
    return results


def test_wrong_dtype_is_rejected_by_triton(server):
    results = _grpc_infer(server, [
        grpc_tensor("text_input", np.array([[b"hi"]], dtype=np.object_), "BYTES"),
        grpc_tensor("max_tokens", np.array([[8.0]], dtype=np.float32), "FP32"),
    ])
    errors = [e for _, e in results if e is not None]
    assert errors, "Triton must reject a tensor whose dtype differs from config.pbtxt"
    assert "max_tokens" in str(errors[0]) and "FP32" in str(errors[0]), str(errors[0])
    _good_request_works(server)


def test_wrong_shape_is_rejected_by_triton(server):
    results = _grpc_infer(server, [grpc_tensor("text_input", np.array([[b"a", b"b"]], dtype=np.object_), "BYTES")])
    errors = [e for _, e in results if e is not None]
    assert errors and "shape" in str(errors[0]).lower()
    _good_request_works(server)


def test_malformed_utf8_prompt_is_rejected(server):
    results = _grpc_infer(server, [grpc_tensor("text_input", np.array([[b"caf\xe9 \xff"]], dtype=np.object_), "BYTES")])
    errors = [e for _, e in results if e is not None]
    assert errors and "not valid UTF-8" in str(errors[0])
    _good_request_works(server)


def test_client_library_raises_the_server_message_and_closes_the_stream_without_cancelling(server, monkeypatch):
    """An error response is its request's last, so the client closes its stream and does not cancel
    it: in Triton 2.51 a stream cancelled just after its error response can keep its model live, and the
    server then waits out its exit timeout at shutdown (docs/operations.md). The real client's
    stop_stream is watched, not replaced."""
    stops: list[bool] = []
    stop_stream = grpcclient.InferenceServerClient.stop_stream

    def watched(client, cancel_requests=False):
        stops.append(cancel_requests)
        return stop_stream(client, cancel_requests)

    monkeypatch.setattr(grpcclient.InferenceServerClient, "stop_stream", watched)
    with pytest.raises(MinionsClientError, match="'top_p' must be in"):
        generate_grpc(server.grpc_url, "minions", "hi", GenerationParams(top_p=2.0))
    assert stops and not any(stops), f"stop_stream's cancel_requests, call by call: {stops}"
    stops.clear()
    generate_grpc(server.grpc_url, "minions", "hi", GenerationParams(max_tokens=8), cancel_after_chunks=1)
    assert any(stops), "a stream left before its end is cancelled"


def test_missing_required_input_is_rejected(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException):
        client.infer("minions", [grpc_tensor("max_tokens", np.array([[4]], dtype=np.int32), "INT32")])
    _good_request_works(server)
