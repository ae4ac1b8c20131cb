"""The LLM's model gone (unloaded by an operator) or its stub killed with SIGKILL mid-stream: requests
are refused at once with UNAVAILABLE and a message saying why, rather than failing after the engine
stall timeout (60 s); a request streaming on the dead stub ends within seconds with that error; the
orchestrator loads the model again and requests are served exactly once it is back. The OpenAI port's
/health, which a balancer and a readiness probe read, answers 503 with the reason meanwhile.

Runs its own server (the default deployment), since it breaks its LLM on purpose.
"""

from __future__ import annotations

import json

import pytest
import tritonclient.grpc as grpcclient

from client.api import GenerationParams, MinionsClientError, generate_grpc
from tests.integration.helpers import (KillAfterChunk, http_request, metric_above, metric_samples, metric_value,
                                       serving_killed_stubs, sole_stub, wait_until)
from harness.openai_frontend import openai_frontend
from harness.stub_kill import kill_outside_locks
from harness.triton_process import ROOT

PROMPT = "Explain in a few sentences why the sky is blue."
PARAMS = {"max_tokens": 48, "chat": True, "speculation": "off"}
LONG = GenerationParams(max_tokens=1000, min_tokens=1000, chat=True, speculation="off")
"""A stream that is still running when its LLM stub is killed."""
STALL = "no response"
"""What the engine stall timeout's error says; a request the dead-stub or not-ready path ends says why
instead ("is not ready", "died"), which is how these tests tell the two apart without a clock."""


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory):
    with serving_killed_stubs(ROOT / "deploy.yaml", tmp_path_factory.mktemp("triton-llm-fault")) as proc:
        yield proc


@pytest.fixture(scope="module")
def health_url(llm_server):
    with openai_frontend(llm_server) as url:
        yield url.removesuffix("/v1") + "/health"


def _health(url: str) -> tuple[int, dict]:
    status, _, body = http_request(url, method="GET", timeout=30)
    return status, json.loads(body)


@pytest.fixture(scope="module")
def plain(llm_server) -> str:
    return generate_grpc(llm_server.grpc_url, "minions", PROMPT, GenerationParams(**PARAMS)).text


def _refusal(server) -> str:
    """A refused request's error message."""
    with pytest.raises(MinionsClientError) as refused:
        generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(**PARAMS), timeout_s=120)
    return str(refused.value)


def _llm_ready(server) -> float | None:
    """The gauge's value; None until the orchestrator has exported it."""
    samples = metric_samples(server.metrics_url, "minions_llm_ready")
    return samples[0][1] if samples else None


def test_requests_are_refused_while_the_llm_is_unloaded(llm_server, plain, health_url):
    server = llm_server
    wait_until(lambda: _health(health_url)[0] == 200, 30, "/health 200 with the LLM serving", interval=0.1)
    operator = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        operator.unload_model("llm")
        wait_until(lambda: _llm_ready(server) == 0.0, 20, "minions_llm_ready == 0", interval=0.1)
        message = _refusal(server)
        assert "is not ready" in message and "llm" in message and STALL not in message, message
        status, body = _health(health_url)
        assert status == 503 and not body["ready"] and "'llm'" in body["reason"], body
        operator.load_model("llm")
        wait_until(lambda: _llm_ready(server) == 1.0, 30, "minions_llm_ready == 1", interval=0.1)
    finally:
        operator.close()
    assert _health(health_url) == (200, {"ready": True})
    assert generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(**PARAMS)).text == plain


def test_the_llm_stub_killed_mid_stream_is_reloaded(llm_server, plain, health_url):
    server = llm_server
    reloads = metric_value(server.metrics_url, "minions_llm_reloads", outcome="success")
    victim = sole_stub(server, "llm_0_0").pid  # not the old instance of an earlier test's reload
    killer = KillAfterChunk(victim, 2)

    with pytest.raises(MinionsClientError) as broken:
        generate_grpc(server.grpc_url, "minions", PROMPT, LONG, on_text=killer, timeout_s=120)
    killer.join()
    assert "died" in str(broken.value) and STALL not in str(broken.value), broken.value
    assert "its stub has died" in server.log_text()

    assert metric_above(server.metrics_url, "minions_llm_reloads", reloads, timeout=60, outcome="success") > reloads, \
        "the dead LLM's model was not loaded again"
    wait_until(lambda: _llm_ready(server) == 1.0, 30, "minions_llm_ready == 1", interval=0.1)
    assert _health(health_url) == (200, {"ready": True})
    assert server.stubs()["llm_0_0"].pid != victim
    assert generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(**PARAMS)).text == plain
    assert generate_grpc(server.grpc_url, "minions", PROMPT,
                         GenerationParams(**{**PARAMS, "speculation": "vote"})).text == plain


def test_the_llm_stub_killed_before_any_request_is_reloaded_without_one(tmp_path):
    """The orchestrator watches its models from load on, not from its first request: an LLM whose stub
    dies before anyone has sent a request is loaded again all the same, and the first request is served
    (it was refused before: the watch started with it)."""
    with serving_killed_stubs(ROOT / "deploy.yaml", tmp_path) as server:
        wait_until(lambda: _llm_ready(server) == 1.0, 30, "minions_llm_ready == 1 with no request sent", interval=0.1)
        victim = server.stubs()["llm_0_0"].pid
        kill_outside_locks(victim)
        assert metric_above(server.metrics_url, "minions_llm_reloads", 0, timeout=60, outcome="success") > 0, \
            "the dead LLM's model was not loaded again"
        wait_until(lambda: _llm_ready(server) == 1.0, 30, "minions_llm_ready == 1 after the reload", interval=0.1)
        assert server.stubs()["llm_0_0"].pid != victim
        assert generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(**PARAMS)).text
