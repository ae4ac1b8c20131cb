"""The orchestrator's TensorRT-LLM mode against a real server: the default deployment with `llm` listed
in the rendered `minions` config's `trtllm_model_names`, as deploy.gpu.yaml renders it for a TensorRT-LLM
verifier. The orchestrator then sends the LLM only tensorrt_llm's own inputs (`seed`, what is left of
`min_tokens`, no `prompt_length`) and no end-of-request `stop`. Greedy output must stay `off`'s,
`min_tokens` must hold, and a presence penalty must be refused. The engine is llama.cpp's here:
TensorRT-LLM itself needs a GPU (docs/deployments.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from client.api import GenerationParams, MinionsClientError, generate_grpc
from minions.deploy.config import ROOT
from tests.integration.helpers import COPY_PROMPT, NearTies, served

PROMPTS = [COPY_PROMPT, "List the numbers from one to twelve in words."]
SHORT = "Answer with one word: yes or no?"
PARAMS = {"max_tokens": 40, "chat": True}


def as_tensorrt_llm_verifier(repo: Path) -> None:
    """Render-time edit: `minions` treats `llm` as TensorRT-LLM's own model."""
    config = repo / "minions" / "config.pbtxt"
    text, found = re.subn(r'(key: "trtllm_model_names"\n  value: \{\n    string_value: )""', r'\1"llm"', config.read_text())
    assert found == 1, "the rendered minions config has no empty trtllm_model_names parameter"
    config.write_text(text)


@pytest.fixture(scope="module")
def trtllm_mode_server(tmp_path_factory):
    yield from served(ROOT / "deploy.yaml", tmp_path_factory.mktemp("trtllm-mode"), edit=as_tensorrt_llm_verifier)


def test_greedy_output_and_min_tokens_hold_with_tensorrt_llms_inputs_only(server, trtllm_mode_server):
    ties = NearTies(trtllm_mode_server)
    for prompt in PROMPTS:
        reference = generate_grpc(server.grpc_url, "minions", prompt, GenerationParams(speculation="off", **PARAMS))
        for speculation in ("off", "vote"):
            text = generate_grpc(trtllm_mode_server.grpc_url, "minions", prompt,
                                 GenerationParams(speculation=speculation, **PARAMS)).text
            ties.assert_same_or_near_tie(prompt, reference.text, text, f"{speculation} in TensorRT-LLM mode")
    plain = generate_grpc(trtllm_mode_server.grpc_url, "minions", SHORT, GenerationParams(speculation="off", **PARAMS))
    assert plain.num_output_tokens < 30, "the prompt must end early for min_tokens to be tested"
    held = generate_grpc(trtllm_mode_server.grpc_url, "minions", SHORT,
                         GenerationParams(speculation="vote", min_tokens=30, **PARAMS))
    assert held.num_output_tokens >= 30


def test_a_tensorrt_llm_verifier_refuses_a_presence_penalty(trtllm_mode_server):
    with pytest.raises(MinionsClientError, match="presence_penalty"):
        generate_grpc(trtllm_mode_server.grpc_url, "minions", SHORT, GenerationParams(presence_penalty=0.5, **PARAMS))
