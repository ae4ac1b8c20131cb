"""An SSM model loaded into the live repository joins the served SSMs with no restart: requests can
name it (`single:<name>`), it drafts, every output stays `off`'s; unloaded, requests draft without it.
A server of its own, so that the SSM it adds stays out of the other tests' way."""

from __future__ import annotations

import shutil

import pytest
import tritonclient.grpc as grpcclient

from client.api import GenerationParams, MinionsClientError, generate_grpc
from tests.integration.helpers import COPY_PROMPT, NearTies, metric_above, metric_value, served, wait_until
from harness.triton_process import ROOT

NEW = "ssm_lookup_live"
PARAMS = {"max_tokens": 48, "chat": True}


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    yield from served(ROOT / "deploy.yaml", tmp_path_factory.mktemp("triton-ssm-joins"))


def _add_model(repository, source: str, name: str) -> None:
    """What an operator does: a new model folder in the repository (here a copy of a rendered SSM)."""
    shutil.copytree(repository / source, repository / name)
    config = repository / name / "config.pbtxt"
    config.write_text(config.read_text().replace(f'"{source}"', f'"{name}"'))


def test_an_ssm_loaded_into_the_live_repository_joins_and_leaves(live_server):
    server = live_server
    single = GenerationParams(speculation=f"single:{NEW}", **PARAMS)
    with pytest.raises(MinionsClientError, match=f"unknown SSM '{NEW}'"):
        generate_grpc(server.grpc_url, "minions", COPY_PROMPT, single)
    reference = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, GenerationParams(speculation="off", **PARAMS))
    _add_model(server.build / "model_repository", "ssm_ngram", NEW)
    operator = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        operator.load_model(NEW)
        wait_until(lambda: metric_value(server.metrics_url, "minions_ssm_ready", ssm=NEW) == 1.0, 20,
                   f"minions_ssm_ready{{ssm={NEW}}} == 1", interval=0.1)
        assert f"SSM {NEW} joined" in server.log_text()
        ties = NearTies(server)
        alone = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, single)
        ties.assert_same_or_near_tie(COPY_PROMPT, reference.text, alone.text, f"{NEW} alone")
        assert metric_above(server.metrics_url, "minions_ssm_drafts", 0.0, timeout=10, ssm=NEW) > 0, \
            f"{NEW} never drafted"
        voted = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, GenerationParams(speculation="vote", **PARAMS))
        ties.assert_same_or_near_tie(COPY_PROMPT, reference.text, voted.text, f"vote with {NEW}")
        operator.unload_model(NEW)
        wait_until(lambda: metric_value(server.metrics_url, "minions_ssm_ready", ssm=NEW) == 0.0, 20,
                   f"minions_ssm_ready{{ssm={NEW}}} == 0", interval=0.1)
        after = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, GenerationParams(speculation="vote", **PARAMS))
        ties.assert_same_or_near_tie(COPY_PROMPT, reference.text, after.text, f"vote after {NEW} left")
    finally:
        operator.close()
