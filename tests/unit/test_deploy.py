"""minions.deploy.render: optional (distilled) SSMs are served only once `make distill` has built them."""

from __future__ import annotations

import pytest
import torch
import yaml

from minions.deploy.artifacts import repacked_gguf, smollm2_gguf
from minions.deploy.config import DECOUPLED_TEMPLATES, ROOT, TEMPLATE_BY_ENGINE, load_deployment
from minions.deploy.render import render_repository
from minions.engines.distilled_model import DistilledDraftModel
from minions.settings import EngineKind, EngineSettings, OrchestratorSettings, VoteSettings
from tiny_models import VOCAB


def write_deploy(tmp_path, tiny_llm, default_speculation="vote"):
    llm_dir = tmp_path / "llm"
    tiny_llm.save_pretrained(llm_dir)
    raw = {
        "cache_dir": str(tmp_path / "cache"),
        "llm": {"name": "llm", "engine": "torch", "source": str(llm_dir)},
        "ssms": [
            {"name": "ssm_ngram", "engine": "ngram"},
            {"name": "ssm_d", "engine": "distilled", "source": "distill/ssm_d", "optional": True},
        ],
        "orchestrator": {"name": "minions", "default_speculation": default_speculation},
    }
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def ssm_names(repo) -> str:
    return param(repo, "minions", "ssm_model_names")


def test_missing_distilled_ssm_is_skipped_then_served_once_built(tmp_path, tiny_llm):
    dep = load_deployment(write_deploy(tmp_path, tiny_llm))
    repo = render_repository(dep, tmp_path / "repo")
    assert ssm_names(repo) == "ssm_ngram" and not (repo / "ssm_d").exists()
    model = DistilledDraftModel.from_teacher(tiny_llm, [0], torch.arange(VOCAB))
    model.save(tmp_path / "cache" / "distill" / "ssm_d", {"name": "ssm_d"})
    repo = render_repository(load_deployment(dep.path), tmp_path / "repo")
    assert ssm_names(repo) == "ssm_ngram,ssm_d"
    assert param(repo, "minions", "lookup_model_names") == "ssm_ngram", "drafts carrying their chances"
    config = (repo / "ssm_d" / "config.pbtxt").read_text()
    assert 'string_value: "distilled"' in config and str(tmp_path / "cache" / "distill" / "ssm_d") in config


def test_a_default_speculation_naming_an_absent_ssm_is_refused_at_render_time(tmp_path, tiny_llm):
    dep = load_deployment(write_deploy(tmp_path, tiny_llm, default_speculation="single:ssm_d"))
    with pytest.raises(ValueError, match="default_speculation: unknown SSM 'ssm_d'"):
        render_repository(dep, tmp_path / "repo")


def test_a_gguf_is_repacked_once_and_an_unknown_file_type_is_refused(tmp_path):
    out = repacked_gguf(smollm2_gguf(), "q8_0", tmp_path)
    assert out == tmp_path / "SmolLM2-135M-Instruct.Q4_1.Q8_0.gguf" and out.stat().st_size > 100 * 2**20
    stamp = out.stat().st_mtime_ns
    assert repacked_gguf(smollm2_gguf(), "Q8_0", tmp_path).stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="unknown llama.cpp file type 'Q9_9'"):
        repacked_gguf(smollm2_gguf(), "Q9_9", tmp_path)


def param(repo, model: str, key: str) -> str:
    text = (repo / model / "config.pbtxt").read_text()
    return text.split(f'key: "{key}"')[1].split('string_value: "')[1].split('"')[0]


def test_unset_orchestrator_keys_render_their_one_default(tmp_path, tiny_llm):
    """deploy.yaml leaves them out: the rendered BLS config carries settings.py's defaults, and the
    draft pool holds one LLM batch."""
    repo = render_repository(load_deployment(write_deploy(tmp_path, tiny_llm)), tmp_path / "repo")
    assert param(repo, "minions", "vote_deadline_ms") == str(VoteSettings.deadline_ms)
    assert param(repo, "minions", "draft_length_candidates") == "0,1,2,3,4,6,8"
    read_back = OrchestratorSettings.from_params({"draft_pool_size": param(repo, "minions", "draft_pool_size"),
                                                  "llm_max_batch_size": param(repo, "minions", "llm_max_batch_size")})
    assert read_back.draft_pool == EngineSettings.max_batch_size
    assert param(repo, "llm", "max_sequences") == str(EngineSettings.max_sequences)


def test_the_orchestrator_reaches_the_engines_through_the_servers_own_grpc_port(tmp_path, tiny_llm):
    """Rendered for the ports the server is started on; without them, from deploy.yaml's server
    section, a wildcard host reached on loopback."""
    path = write_deploy(tmp_path, tiny_llm)
    repo = render_repository(load_deployment(path), tmp_path / "repo", grpc_url="127.0.0.1:47001")
    assert param(repo, "minions", "engine_grpc_url") == "127.0.0.1:47001"
    raw = yaml.safe_load(path.read_text()) | {"server": {"host": "0.0.0.0", "grpc_port": 9001}}
    path.write_text(yaml.safe_dump(raw))
    repo = render_repository(load_deployment(path), tmp_path / "repo")
    assert param(repo, "minions", "engine_grpc_url") == "127.0.0.1:9001"


def test_every_setting_is_rendered_and_read_back_unchanged(tmp_path, tiny_llm):
    """Each rendered config.pbtxt parses as Triton's ModelConfig, and its string parameters give the
    model exactly the settings the renderer computed: a setting added to settings.py reaches the
    model with no template change (the derived admission limit included)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from minions.deploy.render import engine_settings, orchestrator_settings

    dep = load_deployment(write_deploy(tmp_path, tiny_llm))
    repo = render_repository(dep, tmp_path / "repo")
    expected = {"minions": orchestrator_settings(dep)}
    expected |= {m["name"]: engine_settings(m, dep, expected["minions"]) for m in [dep.llm, dep.ssms[0]]}
    assert expected["minions"].active_requests_limit == EngineSettings.max_sequences
    for model, settings in expected.items():
        config = text_format.Parse((repo / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        params = {k: v.string_value for k, v in config.parameters.items()}
        assert set(params) == set(settings.params())
        assert type(settings).from_params(params) == settings


def test_every_engine_kind_has_a_template_of_its_own_name_or_family():
    """Templates are named by what serves them, and each engine kind has one."""
    assert set(TEMPLATE_BY_ENGINE) == set(EngineKind)
    for kind, template in TEMPLATE_BY_ENGINE.items():
        assert (ROOT / "model_repository" / template / "config.pbtxt").is_file(), kind
    assert DECOUPLED_TEMPLATES <= set(TEMPLATE_BY_ENGINE.values())


def test_an_unknown_engine_is_refused_with_the_kinds_listed(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump({"llm": {"name": "llm", "engine": "vllm"}, "orchestrator": {}}))
    with pytest.raises(ValueError, match="unknown engine 'vllm'.*torch, distilled, llamacpp, ngram, suffix, tensorrtllm"):
        load_deployment(path)
