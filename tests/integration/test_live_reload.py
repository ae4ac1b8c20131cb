"""Reloading models on a live server (the model-repository workflow): `minions`, `llm` and an SSM are
loaded again through the repository API while clients stream; the server never aborts, requests go
on being served exactly, the old instance is unloaded once its requests are done, and the server
still stops cleanly on SIGINT afterwards (the `served` fixture body checks the exit)."""

from __future__ import annotations

import threading

import pytest
import tritonclient.grpc as grpcclient

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import COPY_PROMPT, NearTies, served, wait_until
from harness.triton_process import ROOT

PROMPTS = [COPY_PROMPT, "List the numbers from one to twelve in words."]
PARAMS = {"max_tokens": 40, "chat": True}


@pytest.fixture
def reload_server(tmp_path):
    """A server of its own: the reloads below must not reach the session's server."""
    yield from served(ROOT / "deploy.yaml", tmp_path)


class _Clients:
    """Threads that stream `vote` requests one after another until stopped; every output and failure kept."""

    def __init__(self, server, count: int) -> None:
        self.server = server
        self.outputs: list[tuple[str, str]] = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]

    def _run(self, offset: int) -> None:
        i = offset
        while not self._stop.is_set():
            prompt = PROMPTS[i % len(PROMPTS)]
            try:
                out = generate_grpc(self.server.grpc_url, "minions", prompt,
                                    GenerationParams(speculation="vote", **PARAMS), stream=True)
                self.outputs.append((prompt, out.text))
            except Exception as exc:  # any failure fails the test
                self.errors.append(exc)
            i += 1

    def __enter__(self) -> _Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def _unloaded_versions(server, model: str) -> int:
    return server.log_text().count(f"successfully unloaded '{model}' version 1")


@pytest.mark.parametrize("model", ["minions", "llm", "ssm_suffix"])
def test_a_model_reloaded_while_requests_stream(reload_server, model):
    server = reload_server
    reference = {p: generate_grpc(server.grpc_url, "minions", p, GenerationParams(speculation="off", **PARAMS)).text
                 for p in PROMPTS}
    operator = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with _Clients(server, 3) as clients:
            wait_until(lambda: len(clients.outputs) >= 3 or clients.errors, 60, "requests served before the reload")
            operator.load_model(model)
            reloaded_at = len(clients.outputs)
            wait_until(lambda: len(clients.outputs) >= reloaded_at + 6 or clients.errors, 60,
                       "requests served after the reload")
            assert server.proc.poll() is None, f"tritonserver died:\n{server.log_text()[-3000:]}"
        assert not clients.errors, clients.errors
        # The old instance goes once its last requests are answered (the clients have stopped).
        wait_until(lambda: _unloaded_versions(server, model) >= 1, 60, f"the old {model} instance unloaded")
        assert operator.is_model_ready(model)
        after = generate_grpc(server.grpc_url, "minions", PROMPTS[0], GenerationParams(speculation="vote", **PARAMS))
    finally:
        operator.close()
    ties = NearTies(server)
    for prompt, text in [*clients.outputs, (PROMPTS[0], after.text)]:
        ties.assert_same_or_near_tie(prompt, reference[prompt], text, f"vote around a reload of {model}")
    assert "Signal (" not in server.log_text()
