"""minions.deploy.trtllm_build: the TensorRT-LLM engine build of deploy.gpu.yaml, planned and run without a GPU.

The deployment is the real deploy.gpu.yaml with its checkpoints replaced by fake HF directories (a config.json
of model_type qwen2). The plan's commands are checked against TrtllmSettings and against the config.pbtxt
render.py writes, so the engine is built where, and as, it is served. Running is checked with `trtllm-build`
and `subprocess.run` replaced (the external tools), never the module's own logic.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from minions.deploy import trtllm_build
from minions.deploy.config import load_deployment
from minions.deploy.render import render_repository
from minions.deploy.trtllm_build import build_plan, main

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = {"llm": "Qwen2.5-Coder-1.5B-Instruct", "ssm_qwen05": "Qwen2.5-Coder-0.5B-Instruct"}
BATCH = {"llm": 48, "ssm_qwen05": 24}
"""Per-model batch sizes unlike TrtllmSettings' default, so that a build ignoring the entry fails."""


def fake_checkpoint(path: Path, model_type: str = "qwen2") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["Qwen2ForCausalLM"]}))
    return path


def write_deploy(tmp_path: Path, **llm_overrides) -> Path:
    """deploy.gpu.yaml with its sources in tmp_path (fake checkpoints) and its cache under tmp_path."""
    raw = yaml.safe_load((ROOT / "deploy.gpu.yaml").read_text())
    models = {m["name"]: m for m in [raw["llm"], *raw["ssms"]]}
    for name, checkpoint in CHECKPOINTS.items():
        models[name]["source"] = str(fake_checkpoint(tmp_path / "hf" / checkpoint))
        models[name]["max_batch_size"] = BATCH[name]
    raw["llm"].update(llm_overrides)
    path = tmp_path / "deploy.gpu.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value after `name` in a command."""
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def served_model_path(repo: Path, model: str) -> str:
    """The gpt_model_path the rendered config.pbtxt gives Triton's tensorrtllm backend."""
    config = text_format.Parse((repo / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    return config.parameters["gpt_model_path"].string_value


@pytest.fixture
def deploy(tmp_path: Path) -> Path:
    return write_deploy(tmp_path)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """A `trtllm-build` on PATH and subprocess.run recording each step; trtllm-build's stand-in writes what
    the real one does (config.json, rank0.engine) into --output_dir. Returns the recorded commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtllm-build").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "trtllm-build").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    calls: list[tuple[str, ...]] = []

    def run(argv, check=False, **kwargs):
        calls.append(tuple(argv))
        if argv[0] == "trtllm-build":
            out = Path(flag(tuple(argv), "--output_dir"))
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text("{}")
            (out / "rank0.engine").write_bytes(b"engine")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(trtllm_build.subprocess, "run", run)
    return calls


def test_the_plan_builds_each_tensorrtllm_model_where_its_config_pbtxt_serves_it_from(deploy, tmp_path):
    dep = load_deployment(deploy)
    plan = build_plan(dep)
    assert [b.name for b in plan] == ["llm", "ssm_qwen05"]  # not the weightless ssm_ngram, ssm_suffix
    repo = render_repository(dep, tmp_path / "repo")
    for build in plan:
        assert flag(build.build, "--output_dir") == served_model_path(repo, build.name) == str(build.engine_dir)
        assert build.engine_dir == tmp_path / ".cache" / "minions" / "trtllm" / build.name
        # the conversion writes the checkpoint trtllm-build reads, from the entry's HF source
        assert flag(build.convert, "--out") == flag(build.build, "--checkpoint_dir") == str(build.checkpoint_dir)
        assert flag(build.convert, "--checkpoint") == str(tmp_path / "hf" / CHECKPOINTS[build.name])
        assert build.convert[1:4] == ("-m", "minions.deploy.trtllm_build", "convert")
        assert (flag(build.convert, "--dtype"), flag(build.convert, "--tp-size")) == ("bfloat16", "1")


def test_the_llm_is_built_to_verify_external_drafts_and_the_ssm_to_return_its_logits(deploy):
    raw = yaml.safe_load(deploy.read_text())
    llm, ssm = build_plan(load_deployment(deploy))
    assert flag(llm.build, "--speculative_decoding_mode") == "draft_tokens_external"
    assert int(flag(llm.build, "--max_draft_len")) == raw["orchestrator"]["max_num_draft_tokens"] == 16
    assert "--gather_generation_logits" not in llm.build
    assert "--speculative_decoding_mode" not in ssm.build and "--max_draft_len" not in ssm.build
    assert "--gather_generation_logits" in ssm.build
    for build in (llm, ssm):
        entry = raw["llm"] if build is llm else raw["ssms"][0]
        assert flag(build.build, "--use_paged_context_fmha") == "enable"  # KV-cache block reuse needs it
        assert flag(build.build, "--kv_cache_type") == "paged"
        assert flag(build.build, "--remove_input_padding") == "enable"
        assert int(flag(build.build, "--max_batch_size")) == BATCH[build.name] == build.settings.max_batch_size
        assert int(flag(build.build, "--max_num_tokens")) == entry["max_num_tokens"]
        seq_len = raw["orchestrator"]["max_context"]
        assert int(flag(build.build, "--max_seq_len")) == int(flag(build.build, "--max_input_len")) == seq_len


def test_an_llm_max_draft_len_in_deploy_yaml_overrides_the_orchestrators(tmp_path):
    llm, _ = build_plan(load_deployment(write_deploy(tmp_path, max_draft_len=6)))
    assert flag(llm.build, "--max_draft_len") == "6"


def test_dry_run_prints_every_command_and_runs_nothing(deploy, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trtllm_build.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    main(["--deploy", str(deploy), "--dry-run"])
    printed = capsys.readouterr().out.splitlines()
    plan = build_plan(load_deployment(deploy))
    assert printed == [shlex.join(step) for build in plan for step in build.steps]
    assert [shlex.split(line)[0] for line in printed] == [sys.executable, "trtllm-build"] * 2
    assert not (tmp_path / ".cache").exists()


@pytest.mark.parametrize("model", ["llm", "ssm_qwen05"])
def test_a_checkpoint_without_config_json_is_refused_with_the_download_step(deploy, tmp_path, model, tools):
    (tmp_path / "hf" / CHECKPOINTS[model] / "config.json").unlink()
    with pytest.raises(SystemExit) as exc:
        main(["--deploy", str(deploy)])
    message = str(exc.value.code)
    assert f"model {model!r}" in message and "config.json" in message
    hub = f"Qwen/{CHECKPOINTS[model]}"
    assert f"huggingface-cli download {hub} --local-dir {tmp_path / 'hf' / CHECKPOINTS[model]}" in message
    assert tools == []


def test_a_model_type_without_a_converter_is_refused(deploy, tmp_path):
    fake_checkpoint(tmp_path / "hf" / CHECKPOINTS["ssm_qwen05"], model_type="gpt2")
    with pytest.raises(SystemExit, match="model_type 'gpt2' is not supported"):
        main(["--deploy", str(deploy), "--dry-run"])


def test_without_trtllm_build_on_path_it_says_to_run_in_the_container(deploy, tmp_path, monkeypatch, tools):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        main(["--deploy", str(deploy)])
    assert "trtllm-build" in str(exc.value.code) and "docker compose run --rm engines" in str(exc.value.code)
    assert tools == []


def test_an_unchanged_plan_is_skipped_and_a_changed_one_rebuilt(tmp_path, tools):
    deploy = write_deploy(tmp_path)
    main(["--deploy", str(deploy)])
    first = build_plan(load_deployment(deploy))
    assert tools == [step for build in first for step in build.steps]
    stamp = json.loads((first[0].engine_dir / "minions-build.json").read_text())
    assert stamp["steps"] == [list(step) for step in first[0].steps]

    tools.clear()
    main(["--deploy", str(deploy)])
    assert tools == []

    write_deploy(tmp_path, max_draft_len=8)  # only the LLM's plan changes
    main(["--deploy", str(deploy)])
    assert [step[0] for step in tools] == [sys.executable, "trtllm-build"]
    assert flag(tools[1], "--output_dir").endswith("/llm") and flag(tools[1], "--max_draft_len") == "8"

    tools.clear()
    main(["--deploy", str(deploy), "--force"])
    assert len(tools) == 4


def test_a_failed_build_leaves_no_stamp_and_is_retried(deploy, tools, monkeypatch):
    recording = trtllm_build.subprocess.run
    main(["--deploy", str(deploy)])

    def failing(argv, check=False, **kwargs):
        recording(argv, check=check, **kwargs)
        if argv[0] == "trtllm-build":
            raise subprocess.CalledProcessError(1, argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(trtllm_build.subprocess, "run", failing)
    with pytest.raises(SystemExit, match="`trtllm-build .*` failed with exit status 1"):
        main(["--deploy", str(deploy), "--force"])
    monkeypatch.setattr(trtllm_build.subprocess, "run", recording)
    tools.clear()
    main(["--deploy", str(deploy)])  # the LLM's engine failed to rebuild: built again; the SSM's still stands
    assert [flag(step, "--output_dir").rsplit("/", 1)[1] for step in tools if step[0] == "trtllm-build"] == ["llm"]


def test_convert_saves_one_checkpoint_per_tensor_parallel_rank(tmp_path, monkeypatch):
    """The conversion against a stand-in for tensorrt_llm's API (from_hugging_face, save_checkpoint, Mapping)."""
    saved = []

    class Mapping:
        def __init__(self, world_size, rank, tp_size, pp_size):
            self.world_size, self.rank, self.tp_size, self.pp_size = world_size, rank, tp_size, pp_size

    class QWenForCausalLM:
        def __init__(self, mapping):
            self.mapping = mapping

        @classmethod
        def from_hugging_face(cls, hf_dir, dtype, mapping):
            assert (hf_dir, dtype) == (str(checkpoint), "float16")
            return cls(mapping)

        def save_checkpoint(self, out, save_config):
            saved.append((out, self.mapping.rank, self.mapping.world_size, self.mapping.tp_size, save_config))

    package = types.ModuleType("tensorrt_llm")
    package.models = types.SimpleNamespace(QWenForCausalLM=QWenForCausalLM)
    package.mapping = types.SimpleNamespace(Mapping=Mapping)
    for name, module in {"tensorrt_llm": package, "tensorrt_llm.models": package.models,
                         "tensorrt_llm.mapping": package.mapping}.items():
        monkeypatch.setitem(sys.modules, name, module)
    checkpoint = fake_checkpoint(tmp_path / "hf")
    out = tmp_path / "ckpt"
    main(["convert", "--checkpoint", str(checkpoint), "--out", str(out), "--dtype", "float16", "--tp-size", "2"])
    assert saved == [(str(out), 0, 2, 2, True), (str(out), 1, 2, 2, False)]
