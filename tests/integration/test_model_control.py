"""The operator's model-repository workflow on a live server (explicit model control): an SSM unloaded
while requests stream is skipped, loaded back it is used again, with no restart and no request
failing; every output stays `off`'s."""

from __future__ import annotations

import threading
import urllib.request

import tritonclient.grpc as grpcclient

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import COPY_PROMPT, NearTies, metric_value, wait_until

SSM = "ssm_suffix"
PROMPTS = [COPY_PROMPT, "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
           "List the numbers from one to twelve in words."]
PARAMS = {"max_tokens": 48, "chat": True}


def _wait_for_ready(server, value: float) -> None:
    wait_until(lambda: metric_value(server.metrics_url, "minions_ssm_ready", ssm=SSM) == value, 20,
               f"minions_ssm_ready{{ssm={SSM}}} == {value}", interval=0.1)


def test_an_ssm_unloaded_and_loaded_back_while_requests_stream(server):
    reference = {p: generate_grpc(server.grpc_url, "minions", p, GenerationParams(speculation="off", **PARAMS)).text
                 for p in PROMPTS}
    _wait_for_ready(server, 1.0)
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
        wait_until(lambda: outputs or errors, 60, "a first request served with every SSM")
        operator.unload_model(SSM)
        _wait_for_ready(server, 0.0)
        unloaded_at = len(outputs)
        wait_until(lambda: len(outputs) >= unloaded_at + 3 or errors, 30, f"requests served without {SSM}")
        assert not errors, errors
        assert not operator.is_model_ready(SSM)
        operator.load_model(SSM)
        _wait_for_ready(server, 1.0)
    finally:
        stop.set()
        for c in clients:
            c.join()
        operator.close()
    assert not errors, errors

    # Loaded back, it drafts again. Asked by one request at a time: deploy.yaml drafts only while one
    # request decodes (speculation_max_load).
    drafts = metric_value(server.metrics_url, "minions_ssm_drafts", ssm=SSM)

    def drafting_again() -> bool:
        prompt = PROMPTS[len(outputs) % len(PROMPTS)]
        outputs.append((prompt, generate_grpc(server.grpc_url, "minions", prompt,
                                              GenerationParams(speculation="vote", **PARAMS)).text))
        return metric_value(server.metrics_url, "minions_ssm_drafts", ssm=SSM) > drafts

    wait_until(drafting_again, 60, f"{SSM} loaded back drafting again")
    ties = NearTies(server)
    for prompt, text in outputs:
        ties.assert_same_or_near_tie(prompt, reference[prompt], text, f"vote during unload/load of {SSM}")
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200
    assert f"SSM {SSM} is not ready" in server.log_text() and f"SSM {SSM} is ready" in server.log_text()
