"""An SSM's stub killed with SIGKILL: requests still succeed, token-identical, and the server lives on.

Triton 2.51 does not restart a dead stub of a model by itself, so the orchestrator must cope: the
round verifies without a draft, and after a few failures the SSM is skipped by every request.
Runs its own server (deploy.torch.yaml, whose ssm_q4 is a llama.cpp model with a stub of its own), since
it breaks one of its models on purpose.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from benchmarks.server_process import ROOT, TritonProcess
from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import metric_value

PROMPT = "Name three colors."


@pytest.fixture(scope="module")
def doomed_server(tmp_path_factory):
    build = tmp_path_factory.mktemp("triton-fault")
    with TritonProcess(ROOT / "deploy.torch.yaml", log_path=build / "tritonserver.log", build=build) as proc:
        regions = [Path("/dev/shm") / stub.shm_region for stub in proc.stubs().values()]
        yield proc
    # Triton 2.51 waits for the dead stub's model until its 30 s exit timeout, then exits with 1 by
    # itself ("Exit timeout expired"): a Triton limitation, recorded here so a change shows up.
    assert proc.proc.returncode in (0, 1), f"tritonserver had to be killed:\n{proc.log_text()[-3000:]}"
    # A killed stub cannot free its shared memory, and Triton does not: the stop path must.
    assert regions and not [r.name for r in regions if r.exists()], "shared memory left in /dev/shm"


def _stub_pid(server: TritonProcess, instance: str) -> int:
    stub = server.stubs().get(instance)
    assert stub is not None, f"no stub for {instance} of this server"
    return stub.pid


def _failures(server: TritonProcess) -> float:
    return metric_value(server.metrics_url, "minions_ssm_failures", ssm="ssm_q4")


def _kill(server: TritonProcess, instance: str) -> None:
    try:
        os.kill(_stub_pid(server, instance), signal.SIGKILL)
    except AssertionError:
        pass  # already dead (killed by an earlier test of this module)


def test_ssm_killed_in_the_middle_of_a_voted_request(doomed_server):
    """The vote goes on with the SSMs that still answer; the text is still exactly `off`'s."""
    params = {"max_tokens": 64, "chat": True}
    prompt = "Explain in a few sentences why the sky is blue."
    plain = generate_grpc(doomed_server.grpc_url, "minions", prompt, GenerationParams(speculation="off", **params))
    victim = _stub_pid(doomed_server, "ssm_q4_0_0")
    chunks: list[str] = []

    def kill_on_first_chunk(chunk: str) -> None:
        chunks.append(chunk)
        if len(chunks) == 2:  # the first round is plain decoding; the second already used the SSMs
            os.kill(victim, signal.SIGKILL)

    # A fixed draft length: every round asks the SSMs (an adaptive one may settle on s = 0 first).
    voted = generate_grpc(doomed_server.grpc_url, "minions", prompt,
                          GenerationParams(speculation="vote", num_draft_tokens=4, **params), on_text=kill_on_first_chunk)
    assert len(chunks) > 2, "the request went on streaming after the kill"
    assert (voted.text, voted.num_output_tokens) == (plain.text, plain.num_output_tokens)
    assert _failures(doomed_server) >= 1
    assert metric_value(doomed_server.metrics_url, "minions_ssm_drafts", ssm="ssm_ngram") > 0


def test_killed_ssm_stub_does_not_fail_requests(doomed_server):
    params = {"max_tokens": 24, "chat": True}
    plain = generate_grpc(doomed_server.grpc_url, "minions", PROMPT, GenerationParams(speculation="off", **params))
    _kill(doomed_server, "ssm_q4_0_0")

    first = generate_grpc(doomed_server.grpc_url, "minions", PROMPT, GenerationParams(speculation="single:ssm_q4", **params))
    assert (first.text, first.num_output_tokens) == (plain.text, plain.num_output_tokens)
    assert first.total_draft_tokens == 0
    failures = _failures(doomed_server)
    assert failures >= 1

    second = generate_grpc(doomed_server.grpc_url, "minions", PROMPT, GenerationParams(speculation="single:ssm_q4", **params))
    assert second.text == plain.text
    assert _failures(doomed_server) == failures, "the breaker is open: nobody calls the dead SSM"

    other = generate_grpc(doomed_server.grpc_url, "minions", PROMPT, GenerationParams(speculation="single:ssm_ngram", **params))
    assert other.text == plain.text, "the other SSM and the LLM are unaffected"
    assert "SSM ssm_q4 failed" in doomed_server.log_text()
