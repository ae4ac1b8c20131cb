"""The operator's model-repository workflow on a live server (explicit model control): an SSM unloaded
while requests stream is skipped, loaded back it is used again, with no restart and no request
failing; every output stays `off`'s."""

from __future__ import annotations

import threading
import time
import urllib.request

import tritonclient.grpc as grpcclient

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import COPY_PROMPT, NearTies, metric_value

SSM = "ssm_suffix"
PROMPTS = [COPY_PROMPT, "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
           "List the numbers from one to twelve in words."]
PARAMS = {"max_tokens": 48, "chat": True}


def _wait_for_metric(server, value: float, timeout: float = 20.0, **labels) -> None:
    deadline = time.monotonic() + timeout
    while metric_value(server.metrics_url, "minions_ssm_ready", **labels) != value:
        assert time.monotonic() < deadline, f"minions_ssm_ready{labels} did not become {value} in {timeout} s"
        time.sleep(0.1)


def test_an_ssm_unloaded_and_loaded_back_while_requests_stream(server):
    reference = {p: generate_grpc(server.grpc_url, "minions", p, GenerationParams(speculation="off", **PARAMS)).text
                 for p in PROMPTS}
    _wait_for_metric(server, 1.0, ssm=SSM)
    outputs: list[tuple[str, str]] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def stream(offset: int) -> None:
        i = offset
        while not stop.is_set():
            prompt = PROMPTS[i % len(PROMPTS)]
            try:
                outputs.append((prompt, generate_grpc(server.grpc_url, "minions", prompt,
                                                      GenerationParams(speculation="vote", **PARAMS)).text))
            except Exception as exc:  # any failure fails the test
                errors.append(exc)
            i += 1

    clients = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for c in clients:
        c.start()
    operator = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        time.sleep(1.0)
        operator.unload_model(SSM)
        _wait_for_metric(server, 0.0, ssm=SSM)
        unloaded_at = len(outputs)
        deadline = time.monotonic() + 30
        while len(outputs) < unloaded_at + 3:  # requests served while the SSM is away
            assert time.monotonic() < deadline and not errors, f"no request served without {SSM}: {errors}"
            time.sleep(0.1)
        assert not operator.is_model_ready(SSM)
        operator.load_model(SSM)
        _wait_for_metric(server, 1.0, ssm=SSM)
        drafts = metric_value(server.metrics_url, "minions_ssm_drafts", ssm=SSM)
        deadline = time.monotonic() + 30
        while metric_value(server.metrics_url, "minions_ssm_drafts", ssm=SSM) <= drafts:
            assert time.monotonic() < deadline, f"{SSM} loaded back drafts no more"
            time.sleep(0.2)
    finally:
        stop.set()
        for c in clients:
            c.join(120)
        operator.close()
    assert not errors, errors
    ties = NearTies(server)
    for prompt, text in outputs:
        ties.assert_same_or_near_tie(prompt, reference[prompt], text, f"vote during unload/load of {SSM}")
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200
    assert f"SSM {SSM} is not ready" in server.log_text() and f"SSM {SSM} is ready" in server.log_text()
