"""Decoupled-stream protocol, as Triton's QA checks it: per request id, the expected responses, exactly
one final flag, and nothing after it."""

from __future__ import annotations

import threading

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
    """Nothing follows a final flag: a later request sent on the same stream once both finals are in
    ("after", a whole generation of its own) gets its own final last, so any response sent after
    the first two requests' finals would have come before it (one stream delivers in order)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    events: list[tuple[str, bool]] = []
    errors = []
    changed = threading.Condition()

    def on_response(result, error):
        with changed:
            if error is not None:
                errors.append(error)
            else:
                response = result.get_response()
                events.append((response.id, response.parameters["triton_final_response"].bool_param))
            changed.notify_all()

    def finals(*request_ids: str) -> bool:
        return bool(errors) or all((rid, True) in events for rid in request_ids)

    client.start_stream(callback=on_response)
    try:
        client.async_stream_infer("minions", _inputs("Name a fruit.", True, 12), request_id="streamed",
                                  enable_empty_final_response=True)
        client.async_stream_infer("minions", _inputs("Name a color.", False, 12), request_id="whole",
                                  enable_empty_final_response=True)
        with changed:
            assert changed.wait_for(lambda: finals("streamed", "whole"), timeout=120), \
                f"no final response for both requests within 120 s: {events}"
        client.async_stream_infer("minions", _inputs("Name a tree.", True, 12), request_id="after",
                                  enable_empty_final_response=True)
        with changed:
            assert changed.wait_for(lambda: finals("after"), timeout=120), \
                f"no final response for the later request within 120 s: {events}"
    finally:
        client.stop_stream()
        client.close()
    assert not errors
    assert events[-1] == ("after", True), f"a response came after the later request's final: {events}"
    for request_id, expect_many in (("streamed", True), ("whole", False), ("after", True)):
        mine = [final for rid, final in events if rid == request_id]
        finals_at = [i for i, final in enumerate(mine) if final]
        assert finals_at == [len(mine) - 1], f"{request_id}: one final flag, on the last response: {mine}"
        assert (len(mine) > 1) if expect_many else (len(mine) == 1)
    first_after = next(i for i, (rid, _) in enumerate(events) if rid == "after")
    assert {rid for rid, _ in events[first_after:]} == {"after"}, \
        f"nothing for the first two requests once both their finals were in: {events}"
