"""Cancelling a stream mid-generation ends the request and frees the engines' state.

What is checked is what the server is left doing after the client has gone (the LLM idle, no sequence
cached, the request counted cancelled), not how fast a log line appears: on a CPU shared with other
processes every step is slower. Cancellation while a request waits on an SSM is unit-tested
(test_decode_loop).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.api import GenerationParams, MinionsClientError, generate_grpc, generate_http
from tests.integration.helpers import grpc_tensors, metric_value, wait_until

LONG_PROMPT = "Write a very long story about a dragon."
LONG = GenerationParams(max_tokens=600, chat=True, speculation="single:ssm_suffix")
"""600 tokens take ~35 s on 2 quiet cores: a cancelled request must leave nearly all of them undone."""


def _llm_tokens(server) -> float:
    return metric_value(server.metrics_url, "minions_engine_batch_total", model="llm", what="tokens")


def _cancelled(server) -> float:
    return metric_value(server.metrics_url, "minions_requests", outcome="cancelled")


def _cached_sequences(server, model: str = "llm") -> float:
    return metric_value(server.metrics_url, "minions_engine_cached_sequences", model=model)


def _assert_work_stopped(server, tokens_before: float, cancelled_before: float, reached_model: bool = True) -> None:
    """The LLM ends up holding no sequence, so computing nothing for the request, and the request is
    counted cancelled (unless the client left before Triton handed the request over). An engine model
    exports its gauges before it answers a call that frees a sequence or a call cancelled by its
    client, and the orchestrator counts a cancelled request once the LLM has answered its release.

    How many tokens the LLM computed after the client left is printed, not bounded: Minions stops
    within one check (250 ms) of Triton reporting the cancellation, but when Triton reports it is
    Triton's. Usually at once (4-6 tokens); once, on a fresh clone, only after all 600 tokens
    (docs/operations.md)."""
    if reached_model:
        wait_until(lambda: _cancelled(server) > cancelled_before, timeout=60, what="the request counted cancelled")
        assert _cached_sequences(server) == 0, "the LLM holds the cancelled request's sequence after its release"
    else:
        wait_until(lambda: _cached_sequences(server) == 0, timeout=60, what="the LLM holding no sequence")
    print(f"LLM tokens computed for the cancelled request: {_llm_tokens(server) - tokens_before:.0f} "
          f"of up to {LONG.max_tokens}")


def test_cancel_mid_stream_ends_request_and_frees_caches(server):
    tokens, cancelled_before = _llm_tokens(server), _cancelled(server)
    cancelled = generate_grpc(server.grpc_url, "minions", LONG_PROMPT, LONG, cancel_after_chunks=3)
    assert cancelled.finish_reason == "cancelled" and len(cancelled.chunks) == 3
    _assert_work_stopped(server, tokens, cancelled_before)
    # The orchestrator exports its in-process lookups' gauges with its metrics, every flush interval.
    wait_until(lambda: _cached_sequences(server, "ssm_suffix") == 0, timeout=10,
               what="the suffix drafter caching nothing")
    after = generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True))
    assert after.num_output_tokens > 0


def _shm_regions() -> dict[str, int]:
    """Region name -> size; a region grows (by shm-growth-byte-size) when what is held in it outgrows it."""
    return {p.name: p.stat().st_size for p in Path("/dev/shm").glob("triton_python_backend_shm_region*")}


def test_cancellations_leak_no_shared_memory_regions(server):
    """Triton's own QA checks fault paths for shm leaks: regions must not pile up with cancellations."""
    generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True))
    before = _shm_regions()
    assert before, "the running server's stubs hold shared-memory regions"
    for _ in range(3):
        generate_grpc(server.grpc_url, "minions", "Tell me a long story.",
                      GenerationParams(max_tokens=300, chat=True), cancel_after_chunks=2)
    wait_until(lambda: _cached_sequences(server) == 0, timeout=20, what="the LLM caches nothing")
    assert _shm_regions() == before


def test_a_client_that_stops_waiting_cancels_its_request_with_a_clear_error(server):
    """A response that does not come within the client's timeout ends the call with an error that says
    so, and the request does not go on using the server (a stub that dies leaves streams silent)."""
    for protocol, generate, url in [("grpc", generate_grpc, server.grpc_url), ("http", generate_http, server.http_url)]:
        tokens, cancelled_before = _llm_tokens(server), _cancelled(server)
        with pytest.raises(MinionsClientError, match=r"no response from minions for 0\.001 s"):
            generate(url, "minions", LONG_PROMPT, LONG, timeout_s=0.001)
        # The client may leave before Triton hands the request to the model (then it never runs).
        _assert_work_stopped(server, tokens, cancelled_before, reached_model=False)
    assert generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True)).num_output_tokens > 0


ENGINE_CANCELLED = "cancelled by its client"
"""The engine model's log line for a request whose client has gone."""


def test_a_tensorrt_llm_client_that_closes_its_stream_ends_its_llm_generation(server):
    """A client streaming from the `llm` engine model itself (tensorrt_llm's interface) that closes its
    gRPC stream mid-generation cancels its request: the engine stops decoding it instead of going on to
    its request_output_len (for no one, and holding the model's unload until then). A killed
    orchestrator's stream to the LLM closes the same way (test_make_serve)."""
    ids, length = [504, 3575, 282, 4649, 314], 1000
    tokens, logged = _llm_tokens(server), server.log_text().count(ENGINE_CANCELLED)
    responses, three = [], threading.Event()

    def received(result, error) -> None:
        responses.append(error or result)
        if len(responses) == 3:
            three.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=received)
    try:
        client.async_stream_infer("llm", grpc_tensors({
            "input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
            "request_output_len": np.array([[length]], np.int32), "streaming": np.array([[True]], bool)}))
        assert three.wait(60), responses
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert not any(isinstance(r, Exception) for r in responses[:3]), responses  # then the client's CANCELLED
    wait_until(lambda: server.log_text().count(ENGINE_CANCELLED) > logged, timeout=30,
               what="the llm's request cancelled")
    _assert_work_stopped(server, tokens, 0, reached_model=False)
    assert _llm_tokens(server) - tokens < len(ids) + length, "the generation ran to its end"
