"""On a clone with nothing beside it (no ../shared/datasets, no MINIONS_DATASETS), every tool's prompt
loading works from the sets the project ships; a set that is not there is named in one line, and a
tool stops on it before it starts a server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minions.text import datasets
from minions.text.datasets import (COPY_HEAVY, DATASETS, SHIPPED, MissingPromptSet, chat_sets, load_prompts,
                                   set_path)
from tests.support.datasets import write_prompt_sets

ROOT = Path(__file__).resolve().parents[2]
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("MINIONS_DATASETS", datasets.CHAT_SETS_VAR)}


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The project's files as git lists them (tracked, and new ones not ignored), copied into a folder
    whose parent holds nothing else: no ../shared beside it."""
    root = tmp_path_factory.mktemp("alone") / "minions"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, root / rel)
    assert not (root.parent / "shared").exists()
    return root


def run_in(clone: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A Python command in the clone, its own modules first on the path (before the .venv's link to this
    checkout)."""
    path = os.pathsep.join([str(clone / "python_backend"), str(clone)])
    return subprocess.run([sys.executable, *args], cwd=clone, capture_output=True, text=True, timeout=600,
                          env={**(env or CLEAN_ENV), "PYTHONPATH": path})


def test_every_tool_loads_its_prompts_from_the_shipped_sets_alone(clone):
    where = run_in(clone, "-c", "import minions.text.datasets as d; print(d.__file__)")
    assert where.stdout.strip().startswith(str(clone)), where.stderr
    result = run_in(clone, "-m", "benchmarks.prompt_loading")
    assert result.returncode == 0, result.stderr
    tools = json.loads(result.stdout)
    assert "make loadtest" in tools and "make bench-paired" in tools and "make distill" in tools
    for tool, cells in tools.items():
        assert cells, tool
        for cell, prompts in cells.items():
            assert prompts and all(p.strip() for p in prompts), (tool, cell)
    assert len(tools["make loadtest"]["users"]) == 80  # every MT-bench question, cycled by the users
    peers = tools["make bench-peers"]
    chat = [p for streams in (1, 8, 16) for p in peers[f"chat {streams}"]]
    assert len(chat) == len(set(chat)) == 3 * 16  # every cell full, and fresh


def test_a_set_that_is_asked_for_and_absent_stops_the_load_test_with_one_line(clone, tmp_path):
    result = run_in(clone, "-m", "loadtest.run", "--datasets", "finance", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr, result.stderr
    assert "'finance'" in result.stderr and "MINIONS_DATASETS" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_a_chat_mix_naming_an_absent_set_stops_a_benchmark_with_one_line(clone):
    env = {**CLEAN_ENV, datasets.CHAT_SETS_VAR: "finance,mt_bench"}
    result = run_in(clone, "-m", "benchmarks.bench_load", "--out", str(clone / "unused"), env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "'finance'" in result.stderr and not (clone / "unused").exists()


def test_the_shipped_sets_are_read_from_the_project(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))
    monkeypatch.delenv(datasets.CHAT_SETS_VAR, raising=False)
    for name in SHIPPED:
        assert set_path(name).parent == ROOT / "datasets"
        assert len(load_prompts(name, 5)) == 5
    assert chat_sets() == ["mt_bench"]


def test_a_set_in_the_named_folder_comes_before_the_shipped_copy_and_larger_sets_join_when_asked(monkeypatch,
                                                                                                 tmp_path):
    write_prompt_sets(tmp_path, {"mt_bench": ["mine"], "finance": ["money?"]})
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))
    monkeypatch.setenv(datasets.CHAT_SETS_VAR, "finance, mt_bench")
    assert chat_sets() == ["finance", "mt_bench"]
    assert datasets.mixed_prompts(2) == ["money?", "mine"]


def test_unknown_and_absent_sets_raise_what_to_pass(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))
    with pytest.raises(MissingPromptSet, match="no prompt set is named 'nope'"):
        load_prompts("nope", 1)
    for name in set(DATASETS | COPY_HEAVY) - set(SHIPPED):
        with pytest.raises(MissingPromptSet, match=f"MINIONS_DATASETS to the folder that holds it"):
            load_prompts(name, 1)
    monkeypatch.setenv(datasets.CHAT_SETS_VAR, "code_edit")
    with pytest.raises(MissingPromptSet, match="not chat sets"):
        chat_sets()
