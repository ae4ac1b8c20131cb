"""Real tritonservers per session: the default deployment (SmolLM2 verified by llama.cpp; prompt lookup
and suffix drafters) for everything, and deploy.torch.yaml (fp32 torch verifier; a llama.cpp
self-draft with logits) for what needs a model SSM."""

from __future__ import annotations

import pytest
import yaml

from minions.text.datasets import CHAT_SETS_VAR
from tests.integration.helpers import served
from harness.openai_frontend import openai_frontend
from harness.triton_process import ROOT, TritonProcess


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _servers_alive():
    """A tritonserver that dies fails the test it died in, with its exit code and log, rather than
    leaving the tests after it to fail on refused connections."""
    yield
    if deaths := TritonProcess.died():
        pytest.fail("\n\n".join(deaths), pytrace=False)


def _serve(tmp_path_factory, deploy: str):
    yield from served(ROOT / deploy, tmp_path_factory.mktemp("triton-build"))


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The default deployment (deploy.yaml)."""
    yield from _serve(tmp_path_factory, "deploy.yaml")


@pytest.fixture(scope="session")
def torch_server(tmp_path_factory):
    """deploy.torch.yaml: the LLM on torch fp32, ssm_q4 (llama.cpp, drafts with logits) and prompt lookup."""
    yield from _serve(tmp_path_factory, "deploy.torch.yaml")


def _serve_default_with(tmp_path_factory, name: str, known_crash: str | None = None, **orchestrator):
    """The default deployment with some orchestrator settings changed (a server per module that uses it);
    `known_crash`: see helpers.served."""
    build = tmp_path_factory.mktemp(f"triton-{name}")
    raw = yaml.safe_load((ROOT / "deploy.yaml").read_text())
    raw["cache_dir"] = str(ROOT / raw["cache_dir"])
    raw["orchestrator"].update(orchestrator)
    deploy = build / f"deploy.{name}.yaml"
    deploy.write_text(yaml.safe_dump(raw))
    yield from served(deploy, build, known_crash=known_crash)


TRITON_HEADER_RACE = "HandleCancellation called even when the context was not cancelled"
"""Triton 2.51's crash after a stream the `triton_grpc_error` header ended (frontend/triton_stream.py;
fixed upstream in 25.04): the modules that send the header on purpose tolerate it at their server's exit."""


@pytest.fixture(scope="module")
def one_slot_server(tmp_path_factory, request):
    """The default deployment with one request decoding and one waiting, beyond which requests are
    refused; a module that sends the `triton_grpc_error` header sets `SENDS_GRPC_ERROR_HEADER = True`."""
    known = TRITON_HEADER_RACE if getattr(request.module, "SENDS_GRPC_ERROR_HEADER", False) else None
    yield from _serve_default_with(tmp_path_factory, "one-slot", known, max_active_requests=1, max_queued_requests=1)


@pytest.fixture(scope="module")
def speculating_server(tmp_path_factory):
    """The default deployment drafting at any load (deploy.yaml drafts only while one request decodes):
    for verifications of several requests batched in one llama.cpp step."""
    yield from _serve_default_with(tmp_path_factory, "speculating", speculation_max_load=0)


@pytest.fixture(scope="module")
def triton_lookups_server(tmp_path_factory):
    """The default deployment with its lookup drafters called through their Triton models, as before
    they answered in the orchestrator's process."""
    yield from _serve_default_with(tmp_path_factory, "triton-lookups", lookups_in_process=False)


@pytest.fixture(scope="session")
def openai_url(server):
    """The OpenAI-compatible frontend (python -m minions.frontend) in front of `server`: its /v1 URL."""
    with openai_frontend(server) as url:
        yield url


@pytest.fixture
def nothing_beside(tmp_path, monkeypatch):
    """The load tools' prompt sets as on a user's clone with nothing beside it: an empty MINIONS_DATASETS
    folder (no ../shared/datasets) and no chat mix asked for, so they read the sets the project ships."""
    folder = tmp_path / "no-datasets"
    folder.mkdir()
    monkeypatch.setenv("MINIONS_DATASETS", str(folder))
    monkeypatch.delenv(CHAT_SETS_VAR, raising=False)
    return folder
