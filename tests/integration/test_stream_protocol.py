"""Decoupled-stream protocol, as Triton's QA checks it: per request id, the expected responses, exactly
one final flag, and nothing after it."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.grpc as grpcclient

from tests.integration.helpers import grpc_tensor


def _inputs(prompt: str, stream: bool, max_tokens: int):
    return [
        grpc_tensor("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
        grpc_tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        grpc_tensor("stream", np.array([[stream]], dtype=np.bool_), "BOOL"),
        grpc_tensor("chat", np.array([[True]], dtype=np.bool_), "BOOL"),
    ]


def test_each_request_on_a_shared_stream_gets_one_final_and_nothing_after(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    events: list[tuple[str, bool, float]] = []
    errors = []

    def on_response(result, error):
        if error is not None:
            errors.append(error)
            return
        response = result.get_response()
        events.append((response.id, response.parameters["triton_final_response"].bool_param, time.monotonic()))

    client.start_stream(callback=on_response)
    try:
        client.async_stream_infer("minions", _inputs("Name a fruit.", True, 12), request_id="streamed",
                                  enable_empty_final_response=True)
        client.async_stream_infer("minions", _inputs("Name a color.", False, 12), request_id="whole",
                                  enable_empty_final_response=True)
        deadline = time.monotonic() + 120
        while sum(final for _, final, _ in events) < 2 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        time.sleep(1.0)  # anything sent after a final flag would arrive in this window
    finally:
        client.stop_stream()
        client.close()
    assert not errors
    for request_id, expect_many in (("streamed", True), ("whole", False)):
        mine = [(final, t) for rid, final, t in events if rid == request_id]
        finals = [i for i, (final, _) in enumerate(mine) if final]
        assert finals == [len(mine) - 1], f"{request_id}: one final flag, on the last response: {mine}"
        assert (len(mine) > 1) if expect_many else (len(mine) == 1)
