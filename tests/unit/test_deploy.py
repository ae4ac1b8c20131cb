"""minions.deploy: optional (distilled) SSMs are served only once `make distill` has built them."""

from __future__ import annotations

import pytest
import torch
import yaml

from minions.deploy import load_deployment, render_repository
from minions.distill.draft_model import DistilledDraftModel
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
    text = (repo / "minions" / "config.pbtxt").read_text()
    return text.split('key: "ssm_model_names"')[1].split('string_value: "')[1].split('"')[0]


def test_missing_distilled_ssm_is_skipped_then_served_once_built(tmp_path, tiny_llm):
    dep = load_deployment(write_deploy(tmp_path, tiny_llm))
    repo = render_repository(dep, tmp_path / "repo")
    assert ssm_names(repo) == "ssm_ngram" and not (repo / "ssm_d").exists()
    model = DistilledDraftModel.from_teacher(tiny_llm, [0], torch.arange(VOCAB))
    model.save(tmp_path / "cache" / "distill" / "ssm_d", {"name": "ssm_d"})
    repo = render_repository(load_deployment(dep.path), tmp_path / "repo")
    assert ssm_names(repo) == "ssm_ngram,ssm_d"
    config = (repo / "ssm_d" / "config.pbtxt").read_text()
    assert 'string_value: "distilled"' in config and str(tmp_path / "cache" / "distill" / "ssm_d") in config


def test_a_default_speculation_naming_an_absent_ssm_is_refused_at_render_time(tmp_path, tiny_llm):
    dep = load_deployment(write_deploy(tmp_path, tiny_llm, default_speculation="single:ssm_d"))
    with pytest.raises(ValueError, match="default_speculation: unknown SSM 'ssm_d'"):
        render_repository(dep, tmp_path / "repo")
