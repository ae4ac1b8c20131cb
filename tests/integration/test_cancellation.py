"""Cancelling a stream mid-generation ends the request promptly and frees the engines' state."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from client.api import GenerationParams, MinionsClientError, generate_grpc, generate_http


def _gauge(server, name: str, model: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{") and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} for {model} not found")


def _wait_for(predicate, timeout: float, what: str = "condition") -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout} s")


def test_cancel_mid_stream_ends_request_and_frees_caches(server):
    before = server.log_text().count("cancelled by the client")
    # 600 tokens of plain decoding take ~35 s: cancelling after 3 chunks leaves nearly all the work.
    params = GenerationParams(max_tokens=600, chat=True, speculation="single:ssm_suffix")
    cancelled = generate_grpc(server.grpc_url, "minions", "Write a very long story about a dragon.", params,
                              cancel_after_chunks=3)
    cancel_time = time.monotonic()
    assert cancelled.finish_reason == "cancelled" and len(cancelled.chunks) == 3
    waited = _wait_for(lambda: server.log_text().count("cancelled by the client") > before, timeout=20)
    assert time.monotonic() - cancel_time < 10, "cancellation must stop the work well before it would end"
    for model in ("llm", "ssm_suffix"):
        _wait_for(lambda: _gauge(server, "minions_engine_cached_sequences", model) == 0, timeout=20,
                  what=f"{model} caches nothing")
    assert waited < 10
    after = generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True))
    assert after.num_output_tokens > 0
    assert re.search(r"cancelled by the client", server.log_text())


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
    _wait_for(lambda: _gauge(server, "minions_engine_cached_sequences", "llm") == 0, timeout=20)
    assert _shm_regions() == before


def test_a_client_that_stops_waiting_cancels_its_request_with_a_clear_error(server):
    """A response that does not come within the client's timeout ends the call with an error that says
    so, and the request does not go on using the server (a stub that dies leaves streams silent)."""
    before = server.log_text().count("cancelled by the client")
    params = GenerationParams(max_tokens=600, chat=True, speculation="single:ssm_suffix")
    with pytest.raises(MinionsClientError, match=r"no response from minions for 0\.001 s"):
        generate_grpc(server.grpc_url, "minions", "Write a very long story about a dragon.", params, timeout_s=0.001)
    _wait_for(lambda: server.log_text().count("cancelled by the client") > before, timeout=20,
              what="the server sees the cancellation")
    _wait_for(lambda: _gauge(server, "minions_engine_cached_sequences", "llm") == 0, timeout=20, what="llm caches nothing")
    cancelled = server.log_text().count("cancelled by the client")
    with pytest.raises(MinionsClientError, match="no response from minions"):
        generate_http(server.http_url, "minions", "Write a very long story about a dragon.", params, timeout_s=0.001)
    _wait_for(lambda: server.log_text().count("cancelled by the client") > cancelled, timeout=20,
              what="the server sees the HTTP client hang up")
    assert generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True)).num_output_tokens > 0
