"""minions.settings: deploy.yaml entries -> config.pbtxt string parameters -> the adapters' settings,
every default defined once."""

from __future__ import annotations

import pytest
import yaml

from minions.deploy.config import ROOT
from minions.settings import (EarlyDraftSettings, EngineSettings, OrchestratorSettings, ProbeSettings,
                              SsmHealthSettings, VoteSettings)


def test_settings_survive_the_round_trip_through_config_pbtxt_parameters():
    orch = OrchestratorSettings(default_num_draft_tokens="6", draft_length_candidates=(0, 2, 16), pipeline=True,
                                early_drafts=EarlyDraftSettings(min_hit=0.25), vote=VoteSettings(deadline_ms=250),
                                ssm_model_names=("a", "b"))
    params = orch.params()
    assert params["draft_length_candidates"] == "0,2,16" and params["pipeline"] == "true"
    assert params["pipeline_min_hit"] == "0.25" and params["vote_deadline_ms"] == "250"
    assert all(isinstance(v, str) for v in params.values())
    assert OrchestratorSettings.from_params(params) == orch
    engine = EngineSettings(engine="llamacpp", num_threads=1, kv_budget_mb=1.5, draft_min_prob=0.25)
    assert EngineSettings.from_params(engine.params()) == engine


def test_absent_or_empty_parameters_keep_their_defaults():
    assert OrchestratorSettings.from_params({"ssm_model_names": "", "max_context": ""}) == OrchestratorSettings()
    assert EngineSettings.from_params({"engine": "ngram", "unknown": "x"}) == EngineSettings(engine="ngram")


def test_from_yaml_takes_settings_and_ignores_other_keys():
    entry = {"name": "ssm_q4", "engine": "llamacpp", "source": "smollm2", "repack": "F16", "num_threads": 1,
             "draft_min_prob": None}
    settings = EngineSettings.from_yaml(entry, model_name="ssm_q4", max_context=512)
    assert (settings.engine, settings.num_threads, settings.max_context) == ("llamacpp", 1, 512)
    assert settings.draft_min_prob == EngineSettings.draft_min_prob, "a null in YAML keeps the default"


def test_the_shipped_deploy_yaml_is_read_as_written():
    raw = yaml.safe_load((ROOT / "deploy.yaml").read_text())
    orch = OrchestratorSettings.from_yaml(raw["orchestrator"])
    assert orch.draft_length_candidates == tuple(raw["orchestrator"]["draft_length_candidates"])
    assert orch.num_draft_tokens is None and orch.pipeline is raw["orchestrator"]["pipeline"]
    assert orch.vote.deadline_s == raw["orchestrator"]["vote_deadline_ms"] / 1000
    assert orch.early_drafts.min_hit == raw["orchestrator"]["pipeline_min_hit"]
    assert orch.llm_stream.interval_ms == raw["orchestrator"]["llm_stream_interval_ms"]


def test_a_group_of_settings_is_nested_in_code_and_flat_in_files():
    """`settings.probe.min_gap` is deploy.yaml's and config.pbtxt's `probe_min_gap`; a top-level key that
    shares a group's prefix (`ssm_model_names` beside the `ssm_` health settings) stays its own."""
    orch = OrchestratorSettings.from_yaml({"probe_min_gap": 5, "ssm_breaker_threshold": 7, "ssm_reload": False},
                                          ssm_model_names=("a",))
    assert orch.probe == ProbeSettings(min_gap=5) and orch.ssm_health == SsmHealthSettings(breaker_threshold=7,
                                                                                          reload=False)
    assert orch.ssm_model_names == ("a",) and orch.params()["ssm_breaker_threshold"] == "7"
    assert "probe" not in orch.params() and "min_gap" not in orch.params()
    assert orch.with_keys(probe_min_gap=9).probe.min_gap == 9 and orch.probe.min_gap == 5
    with pytest.raises(TypeError, match="no setting probe_gap"):
        orch.with_keys(probe_gap=9)


def test_kv_budget_and_draft_length_conversions():
    assert EngineSettings().kv_budget_bytes() is None
    assert EngineSettings(kv_budget_mb=2).kv_budget_bytes() == 2 * 2**20
    assert OrchestratorSettings(default_num_draft_tokens="5").num_draft_tokens == 5
    with pytest.raises(ValueError, match="must be `adaptive` or a number"):
        OrchestratorSettings(default_num_draft_tokens="lots").check()
