"""Load above capacity: requests beyond the LLM's `max_sequences` wait for a slot (no sequence is
evicted and recomputed), requests beyond the wait queue are refused at once with UNAVAILABLE, and
every request served is exact.

Runs its own small server (the default deployment with max_sequences 2 and a queue of 2), so that
capacity is reached with a few requests.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import yaml

from client.api import GenerationParams, MinionsClientError, generate_grpc
from tests.integration.helpers import NearTies, metric_above, metric_value, served, wait_until
from harness.triton_process import ROOT

PROMPT = "Name three animals that live in the sea."
PARAMS = GenerationParams(max_tokens=16, chat=True, speculation="off")
SEQUENCES, QUEUED, CLIENTS = 2, 2, 8


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    build = tmp_path_factory.mktemp("triton-small")
    raw = yaml.safe_load((ROOT / "deploy.yaml").read_text())
    raw["cache_dir"] = str(ROOT / raw["cache_dir"])
    raw["llm"].update(max_sequences=SEQUENCES, max_batch_size=SEQUENCES)
    raw["orchestrator"]["max_queued_requests"] = QUEUED
    deploy = build / "deploy.small.yaml"
    deploy.write_text(yaml.safe_dump(raw))
    yield from served(deploy, build)


def _llm_tokens(server, requests: float) -> float:
    """The LLM's computed tokens once the orchestrator has counted `requests` requests, however they
    ended: it counts one once the LLM has answered its release, and the LLM exports its gauges before
    answering a release, so none of those requests' steps is missing from the count."""
    counted = metric_above(server.metrics_url, "minions_requests", requests - 1, timeout=30)
    assert counted >= requests, f"the orchestrator counted {counted:.0f} requests of {requests:.0f}"
    return metric_value(server.metrics_url, "minions_engine_batch_total", model="llm", what="tokens")


def _requests(server) -> float:
    return metric_value(server.metrics_url, "minions_requests")


def test_beyond_capacity_requests_wait_and_beyond_the_queue_are_refused(small_server):
    server = small_server
    counted = _requests(server)
    before = _llm_tokens(server, counted)
    reference = generate_grpc(server.grpc_url, "minions", PROMPT, PARAMS).text
    alone = _llm_tokens(server, counted + 1) - before  # what one request costs the LLM: its prompt and its tokens

    results: list[object] = [None] * CLIENTS
    start = threading.Barrier(CLIENTS)

    def client(i: int) -> None:
        start.wait()
        try:
            results[i] = generate_grpc(server.grpc_url, "minions", PROMPT, PARAMS).text
        except MinionsClientError as exc:
            results[i] = exc

    counted = _requests(server)
    before = _llm_tokens(server, counted)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [r for r in results if isinstance(r, MinionsClientError)]
    served = [r for r in results if isinstance(r, str)]
    assert len(served) + len(refused) == CLIENTS, f"a request neither served nor refused: {results}"
    assert refused and all("the server is at capacity" in str(e) for e in refused), results
    assert len(served) >= SEQUENCES + QUEUED, "requests within the queue wait for a slot"
    ties = NearTies(server)
    for text in served:
        ties.assert_same_or_near_tie(PROMPT, reference, text, "a request served under overload")
    computed = _llm_tokens(server, counted + CLIENTS) - before
    assert computed <= 1.2 * alone * len(served), \
        f"the LLM computed {computed:.0f} tokens for {len(served)} requests of {alone:.0f}: sequences were recomputed"
    assert metric_above(server.metrics_url, "minions_requests", len(refused) - 1, outcome="unavailable") >= len(refused)
    assert generate_grpc(server.grpc_url, "minions", PROMPT, PARAMS).text == reference, "the server serves on"


class _Left(Exception):
    """Raised by a client's text callback to leave its stream (closing it cancels the request)."""


def test_the_requests_running_and_waiting_are_exported_as_vllm_names_them(small_server):
    """Two long requests hold both slots and a third waits: the gauges say 2 and 1 while that lasts
    (the third is admitted only when one of the two ends), and 0 and 0 once every client has left
    (each closes its stream at its next text once told, which cancels its request: on a busy machine
    the three requests' 1,200 tokens take longer than the suite's timeout)."""
    server = small_server

    def gauges() -> tuple[float, float]:
        return tuple(metric_value(server.metrics_url, f"minions_num_requests_{what}", model="minions")
                     for what in ("running", "waiting"))

    leave = threading.Event()

    def on_text(_: str) -> None:
        if leave.is_set():
            raise _Left

    def client() -> None:
        with contextlib.suppress(_Left):
            generate_grpc(server.grpc_url, "minions", PROMPT, long, on_text=on_text)

    long = GenerationParams(max_tokens=400, min_tokens=400, chat=True, speculation="off")
    threads = [threading.Thread(target=client) for _ in range(SEQUENCES + 1)]
    for t in threads:
        t.start()
    wait_until(lambda: gauges() == (SEQUENCES, 1), 30, "two requests running and one waiting")
    leave.set()
    for t in threads:
        t.join()
    wait_until(lambda: gauges() == (0, 0), 60, "no request running or waiting once every client has left")
