"""minions.deploy.schema: a deployment file is checked before anything is rendered, every problem reported
as one line naming its key; the shipped deployments are valid; the server's command line reports a bad
file without a traceback."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import yaml

from minions.deploy import schema
from minions.deploy.config import ROOT, DeploymentError, load_deployment
from minions.settings import EngineSettings, OrchestratorSettings
from minions.settings_fields import Settings, group, ranged
from minions.trtllm_settings import TrtllmSettings

SHIPPED = sorted(ROOT.glob("deploy*.yaml"))


def base() -> dict:
    """A valid deployment, as a loaded file."""
    return {
        "server": {"host": "127.0.0.1", "http_port": 8000},
        "llm": {"name": "llm", "engine": "llamacpp", "source": "smollm2", "num_threads": 2},
        "ssms": [{"name": "ssm_ngram", "engine": "ngram", "max_ngram": 3},
                 {"name": "ssm_trt", "engine": "tensorrtllm", "source": "hf/x", "kv_cache_free_gpu_mem_fraction": 0.3}],
        "orchestrator": {"name": "minions", "default_speculation": "vote", "draft_length_candidates": [0, 2, 4]},
    }


def problems(raw: dict) -> list[str]:
    return schema.problems(schema.normalized(raw))


def write(tmp_path, text: str):
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def test_the_base_deployment_is_valid():
    assert problems(base()) == []


def test_the_shipped_deployments_are_found():
    assert {p.name for p in SHIPPED} >= {"deploy.yaml", "deploy.qwen.yaml", "deploy.torch.yaml", "deploy.gpu.yaml",
                                         "deploy.cuda.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_each_shipped_deployment_is_valid(path):
    assert problems(yaml.safe_load(path.read_text())) == []
    assert load_deployment(path).llm["name"]


@pytest.mark.parametrize("change, expected", [
    (lambda raw: raw.pop("orchestrator"), "orchestrator: required"),
    (lambda raw: raw["llm"].pop("name"), "llm.name: required"),
    (lambda raw: raw["llm"].pop("source"), "llm.source: required"),  # the LLM's tokenizer comes from it
    (lambda raw: raw["ssms"][1].pop("source"), "ssms[1].source: required"),
    (lambda raw: raw["ssms"][0].pop("engine"), "ssms[0].engine: required"),
    (lambda raw: raw["llm"].update(name=None), "llm.name: required"),
])
def test_a_missing_required_key_is_named(change, expected):
    raw = base()
    change(raw)
    assert problems(raw) == [expected]


def test_an_ssm_without_model_files_needs_no_source_and_the_orchestrator_no_name():
    raw = base()
    raw["orchestrator"].pop("name")
    assert raw["ssms"][0].get("source") is None and problems(raw) == []


@pytest.mark.parametrize("change, expected", [
    (lambda raw: raw["server"].update(http_port="eighty"), "server.http_port: expected an integer, got 'eighty'"),
    (lambda raw: raw["llm"].update(num_threads=1.5), "llm.num_threads: expected an integer, got 1.5"),
    (lambda raw: raw["orchestrator"].update(pipeline="sometimes"),
     "orchestrator.pipeline: expected true or false, got 'sometimes'"),
    (lambda raw: raw["orchestrator"].update(draft_length_candidates=[1, "two"]),
     "orchestrator.draft_length_candidates: expected a list of integers, got a list"),
    (lambda raw: raw["llm"].update(dtype=True), "llm.dtype: expected a string, got true (quote it to keep it text)"),
    (lambda raw: raw.update(ssms={"name": "x"}), "ssms: expected a list, got a mapping"),
    (lambda raw: raw["ssms"].append("ssm_suffix"), "ssms[2]: expected a mapping, got 'ssm_suffix'"),
    (lambda raw: raw.update(cache_dir=None), "cache_dir: expected a string, got null"),
    (lambda raw: raw["ssms"][0].update(name=5), "ssms[0].name: expected a string, got 5"),
    (lambda raw: raw["llm"].update(engine="vllm"),
     "llm.engine: unknown engine 'vllm'; one of: torch, distilled, llamacpp, ngram, suffix, tensorrtllm"),
])
def test_a_value_of_the_wrong_type_is_named_with_what_was_expected(change, expected):
    raw = base()
    change(raw)
    assert problems(raw) == [expected]


@pytest.mark.parametrize("change, expected", [
    (lambda raw: raw["server"].update(http_port=70000), "server.http_port: must be between 1 and 65535, got 70000"),
    (lambda raw: raw["llm"].update(num_threads=0), "llm.num_threads: must be >= 1, got 0"),
    (lambda raw: raw["ssms"][0].update(max_ngram=-1), "ssms[0].max_ngram: must be >= 1, got -1"),
    (lambda raw: raw["ssms"][1].update(kv_cache_free_gpu_mem_fraction=1.2),
     "ssms[1].kv_cache_free_gpu_mem_fraction: must be between 0 and 1, got 1.2"),
    (lambda raw: raw["orchestrator"].update(vote_deadline_ms=-5),
     "orchestrator.vote_deadline_ms: must be >= 0, got -5"),
    (lambda raw: raw["orchestrator"].update(draft_length_candidates=[0, -2]),
     "orchestrator.draft_length_candidates: must be >= 0, got -2"),
])
def test_a_number_out_of_range_is_named_with_its_range(change, expected):
    raw = base()
    change(raw)
    assert problems(raw) == [expected]


@pytest.mark.parametrize("change, expected", [
    (lambda raw: raw["llm"].update(max_sequence=16), "llm.max_sequence: unknown key (did you mean max_sequences?)"),
    (lambda raw: raw["orchestrator"].update(defualt_speculation="off"),
     "orchestrator.defualt_speculation: unknown key (did you mean default_speculation?)"),
    (lambda raw: raw.update(ssm=[]), "ssm: unknown key (did you mean ssms?)"),
    (lambda raw: raw["server"].update(colour="blue"), "server.colour: unknown key"),
    (lambda raw: raw["ssms"][0].update(repack="F16"), "ssms[0].repack: unknown key"),  # llama.cpp's key only
    (lambda raw: raw["ssms"][1].update(num_threads=2), "ssms[1].num_threads: unknown key"),  # not TensorRT-LLM's
    (lambda raw: raw["llm"].update(max_context=4096),
     "llm.max_context: derived from the rest of the deployment, not set in the file"),
    (lambda raw: raw["orchestrator"].update(tokenizer_path="x"),
     "orchestrator.tokenizer_path: derived from the rest of the deployment, not set in the file"),
])
def test_an_unknown_key_is_refused_with_the_nearest_known_one(change, expected):
    raw = base()
    change(raw)
    assert problems(raw) == [expected]


@pytest.mark.parametrize("change, expected", [
    (lambda raw: raw["ssms"][0].update(name="llm"), "ssms[0].name: 'llm' is already the name of llm"),
    (lambda raw: (raw["orchestrator"].pop("name"), raw["ssms"][0].update(name="minions")),
     "ssms[0].name: 'minions' is already the name of orchestrator"),
    (lambda raw: raw["orchestrator"].update(default_speculation="single:ssm_nope"),
     "orchestrator.default_speculation: unknown SSM 'ssm_nope' in speculation 'single:ssm_nope'; "
     "known: ssm_ngram, ssm_trt"),
    (lambda raw: raw["orchestrator"].update(default_num_draft_tokens="many"),
     "orchestrator: default_num_draft_tokens must be `adaptive` or a number, got 'many'"),
    (lambda raw: raw["llm"].update(batch_invariant=True),
     "llm: batch_invariant needs kv_unified: false (in one KV buffer attention sums over cells in the order they "
     "were filled)"),
])
def test_values_that_cannot_be_served_are_named(change, expected):
    raw = base()
    change(raw)
    assert problems(raw) == [expected]


def test_default_speculation_off_unquoted_is_the_mode_off(tmp_path):
    """YAML reads `off` as false: the file's own comment offers it, so it means the mode `off`."""
    text = yaml.safe_dump(base()).replace("default_speculation: vote", "default_speculation: off")
    dep = load_deployment(write(tmp_path, text))
    assert dep.orchestrator["default_speculation"] == "off"
    assert OrchestratorSettings.from_yaml(dep.orchestrator).default_speculation == "off"


def test_a_number_where_a_setting_is_text_is_its_text():
    raw = base()
    raw["orchestrator"]["default_num_draft_tokens"] = 4
    raw["ssms"][1]["gpu_device_ids"] = 0
    assert problems(raw) == []


def test_default_speculation_true_is_refused_with_a_hint_to_quote_it():
    raw = base()
    raw["orchestrator"]["default_speculation"] = True
    assert problems(raw) == ["orchestrator.default_speculation: expected a string, got true (quote it to keep it text)"]


def test_every_problem_is_reported_at_once_each_on_one_line_with_the_file(tmp_path):
    raw = base()
    raw["llm"].pop("name")
    raw["llm"]["num_thread"] = 2
    raw["server"]["grpc_port"] = 0
    path = write(tmp_path, yaml.safe_dump(raw))
    with pytest.raises(DeploymentError) as caught:
        load_deployment(path)
    assert caught.value.problems == [f"{path}: server.grpc_port: must be between 1 and 65535, got 0",
                                     f"{path}: llm.name: required",
                                     f"{path}: llm.num_thread: unknown key (did you mean num_threads?)"]
    assert str(caught.value).splitlines() == caught.value.problems


def test_an_unreadable_file_is_one_problem(tmp_path):
    with pytest.raises(DeploymentError) as caught:
        load_deployment(write(tmp_path, "llm:\n  name: [llm\n"))
    assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(f"{tmp_path / 'deploy.yaml'}:3: ")
    with pytest.raises(DeploymentError, match="No such file"):
        load_deployment(tmp_path / "absent.yaml")
    with pytest.raises(DeploymentError, match="expected a mapping of sections"):
        load_deployment(write(tmp_path, "- llm\n"))


def test_every_setting_type_is_known_to_the_schema():
    """A new setting needs no schema edit, but a setting of a new type needs a TYPES entry."""
    for cls in (EngineSettings, TrtllmSettings, OrchestratorSettings):
        for name, key in schema.settings_keys(cls).items():
            assert key.kind in schema.TYPES, f"{cls.__name__}.{name}: {key.kind}"


@dataclasses.dataclass(frozen=True)
class _Inner(Settings):
    depth: int = ranged(1, 1, 3)


@dataclasses.dataclass(frozen=True)
class _Made(Settings):
    width: int = ranged(4, 2, 8)
    label: str = ""
    inner: _Inner = group(_Inner, "inner_")


def test_a_settings_field_is_a_key_with_its_type_and_range():
    keys = schema.settings_keys(_Made)
    assert (keys["width"].kind, keys["width"].lowest, keys["width"].highest) == (int, 2, 8)
    assert (keys["label"].kind, keys["label"].lowest, keys["label"].highest) == (schema.TEXT, 0, None)
    assert (keys["inner_depth"].kind, keys["inner_depth"].lowest, keys["inner_depth"].highest) == (int, 1, 3)
    assert "inner" not in keys, "a group is its settings' keys, not one of its own"


def test_the_server_command_reports_a_bad_file_one_line_per_problem_without_a_traceback(tmp_path):
    raw = base()
    raw["orchestrator"].pop("name")
    raw["llm"].pop("source")
    raw["llm"]["max_sequence"] = 4
    raw["ssms"][0]["max_ngram"] = 0
    path = write(tmp_path, yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python_backend")}
    done = subprocess.run([sys.executable, "-m", "minions.deploy.server", "--deploy", str(path), "--prepare-only",
                           "--build", str(tmp_path / "build")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"{path}: llm.source: required",
                                        f"{path}: llm.max_sequence: unknown key (did you mean max_sequences?)",
                                        f"{path}: ssms[0].max_ngram: must be >= 1, got 0"]
    assert not (tmp_path / "build").exists()
