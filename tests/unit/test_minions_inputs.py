"""minions.serving.inputs: the one table of the `minions` model's inputs, held against the rendered
config, the compatibility tables, the settings its defaults come from, and docs/api.md."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from minions.serving.compat import NEUTRAL_ONLY, UNSUPPORTED_FEATURES
from minions.serving.inputs import INPUTS, SERVED, pbtxt_inputs
from minions.serving.request import parse_generation_request
from minions.settings import DEFAULTS, OrchestratorSettings

ROOT = Path(__file__).resolve().parents[2]


def test_the_rendered_block_declares_every_input_of_the_table_and_only_text_input_is_required():
    config = text_format.Parse(pbtxt_inputs(), model_config_pb2.ModelConfig())
    assert [i.name for i in config.input] == list(INPUTS)
    assert [i.name for i in config.input if not i.optional] == ["text_input"]
    for declared in config.input:
        spec = INPUTS[declared.name]
        assert model_config_pb2.DataType.Name(declared.data_type) == spec.data_type
        assert tuple(declared.dims) == spec.dims


def test_the_template_takes_its_inputs_from_the_table():
    template = (ROOT / "model_repository" / "minions" / "config.pbtxt").read_text()
    assert "${minions_inputs}" in template and "input [" not in template


def test_every_refused_or_neutral_only_input_is_declared_but_not_served():
    for name in [*UNSUPPORTED_FEATURES, *NEUTRAL_ONLY]:
        assert name in INPUTS and name not in SERVED, name


@pytest.mark.parametrize("name", [n for n, i in SERVED.items() if i.setting])
def test_a_deployment_default_follows_its_setting(name):
    """Change the setting and the parsed request follows, with no other literal in between."""
    spec = SERVED[name]
    field = {f.name: f for f in dataclasses.fields(OrchestratorSettings)}[spec.setting]
    other = {"default_max_tokens": 77, "default_num_draft_tokens": "3", "default_speculation": "off",
             "default_chat": not DEFAULTS.default_chat, "default_use_draft_logits": not DEFAULTS.default_use_draft_logits,
             "pipeline": not DEFAULTS.pipeline}[field.name]
    limits = dataclasses.replace(DEFAULTS, ssm_model_names=("ssm",), **{field.name: other})
    request = parse_generation_request({"text_input": np.array([[b"hi"]], dtype=object)}, limits)
    got = {"max_tokens": request.max_tokens, "num_draft_tokens": request.num_draft_tokens,
           "speculation": str(request.speculation), "chat": request.chat,
           "use_draft_logits": request.use_draft_logits, "pipeline": request.pipeline}[name]
    assert got == (3 if name == "num_draft_tokens" else other)


def test_an_orchestrator_built_without_rendering_admits_and_drafts():
    """The limits that 0 means "the LLM's" resolve in settings, not only in the renderer."""
    assert DEFAULTS.active_requests_limit > 0 and DEFAULTS.draft_pool > 0
    assert DEFAULTS.with_keys(max_active_requests=3, draft_pool_size=2).active_requests_limit == 3
    assert dataclasses.replace(DEFAULTS, llm_max_sequences=5).active_requests_limit == 5


def _inputs_table() -> str:
    api = (ROOT / "docs" / "api.md").read_text()
    return api[api.index("## Inputs"):api.index("## Outputs")]


@pytest.mark.parametrize("name", list(SERVED))
def test_docs_list_every_served_input_with_where_its_default_comes_from(name):
    rows = [row for row in _inputs_table().splitlines() if row.startswith("|") and f"`{name}`" in row.split("|")[1]]
    assert rows, f"docs/api.md's inputs table has no row for {name}"
    setting = SERVED[name].setting
    if setting:
        assert f"`{setting}`" in rows[0], f"docs/api.md: {name}'s default comes from deploy.yaml `{setting}`"
    default = SERVED[name].default(DEFAULTS)
    if isinstance(default, bool):
        assert str(default).lower() in rows[0].split("|")[3], f"docs/api.md: {name} defaults to {default}"
    elif isinstance(default, (int, float)) and not setting:
        assert re.search(rf"\b{default:g}\b", rows[0].split("|")[3]), f"docs/api.md: {name} defaults to {default:g}"
