"""TensorRT-LLM engines for a deployment's `engine: tensorrtllm` models, built where they are served from.

    python -m minions.deploy.trtllm_build --deploy deploy.gpu.yaml [--dry-run] [--force]   (`make engines`)

Runs inside NVIDIA's Triton TRT-LLM container (nvcr.io/nvidia/tritonserver:25.05-trtllm-python-py3), which
has `tensorrt_llm` and `trtllm-build`. Each model takes two steps: its Hugging Face checkpoint (`source`)
is converted into a TensorRT-LLM checkpoint by this module's `convert` subcommand (TensorRT-LLM's Python
API, imported only there), then `trtllm-build` compiles it into the model's `engine_dir`, the directory
render.py writes into its config.pbtxt as `gpt_model_path`. Every value comes from TrtllmSettings, as
render.trtllm_settings resolves it, so the build and the served config cannot disagree. A stamp in the
engine directory records the plan it was built from; an unchanged plan is skipped, a changed one rebuilt.

Every engine gets a paged KV cache and paged context FMHA (KV-cache block reuse needs them: each
speculation round resends the whole sequence); the verifier is built for external draft tokens, draft
models gather generation logits. Where each flag was checked: docs/deployments.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from minions.deploy.artifacts import hf_dir_for
from minions.deploy.config import ROOT, Deployment, load_or_exit, resolve
from minions.deploy.render import orchestrator_settings, trtllm_settings
from minions.settings import EngineKind
from minions.trtllm_settings import TrtllmSettings

log = logging.getLogger(__name__)

MODULE = "minions.deploy.trtllm_build"
TRTLLM_BUILD = "trtllm-build"
STAMP = "minions-build.json"
"""In the engine directory: the plan the engine there was built from."""
ENGINE_FILE = "rank0.engine"
"""What trtllm-build writes (with config.json) into its output directory: one engine per rank."""
MODEL_CLASSES = {"qwen2": "QWenForCausalLM", "llama": "LLaMAForCausalLM", "mistral": "LLaMAForCausalLM"}
"""HF config.json `model_type` -> the tensorrt_llm.models class that converts it."""
CONTAINER_HINT = "run it inside the Triton TRT-LLM container, e.g. `docker compose run --rm engines`"


class BuildError(RuntimeError):
    """A deployment that cannot be built as it stands; the message says what to do."""


@dataclass(frozen=True)
class EngineBuild:
    """One model's engine: its settings, the TensorRT-LLM checkpoint work directory and the two steps."""

    settings: TrtllmSettings
    checkpoint_dir: Path
    """The TensorRT-LLM checkpoint the conversion writes and trtllm-build reads."""
    convert: tuple[str, ...]
    build: tuple[str, ...]
    source_digest: str
    """sha256 of the HF checkpoint's config.json: a different model in the same directory is rebuilt."""

    @property
    def name(self) -> str:
        return self.settings.model_name

    @property
    def engine_dir(self) -> Path:
        return Path(self.settings.engine_dir)

    @property
    def steps(self) -> tuple[tuple[str, ...], ...]:
        return self.convert, self.build

    def stamp(self) -> dict:
        """What the stamp file records: the exact commands and the checkpoint they read."""
        return {"steps": [list(step) for step in self.steps], "source_config_sha256": self.source_digest}


def trtllm_models(dep: Deployment) -> list[dict]:
    """The deployment's models served by TensorRT-LLM (the LLM and SSMs)."""
    return [m for m in [dep.llm, *dep.ssms] if m.get("engine") == EngineKind.TENSORRTLLM]


def hf_config(model: dict, dep: Deployment) -> Path:
    """A model's HF config.json (the checkpoint render.py resolves too), or a BuildError naming the
    download that provides it."""
    try:
        return hf_dir_for(model["source"], dep) / "config.json"
    except FileNotFoundError:
        name = Path(model["source"]).name
        repo = f"Qwen/{name}" if name.startswith("Qwen") else f"<org>/{name}"
        missing = resolve(model["source"], dep.path.parent) / "config.json"
        raise BuildError(f"model {model['name']!r}: no Hugging Face checkpoint at {missing.parent} ({missing.name} "
                         f"missing). Download it first (README, Deploying on a GPU), e.g. "
                         f"`huggingface-cli download {repo} --local-dir {model['source']}`") from None


def model_class_name(config_json: Path) -> str:
    """The tensorrt_llm.models class converting a checkpoint, from its config.json's model_type."""
    model_type = json.loads(config_json.read_text()).get("model_type")
    if model_type not in MODEL_CLASSES:
        raise BuildError(f"{config_json}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(sorted(MODEL_CLASSES))})")
    return MODEL_CLASSES[model_type]


def convert_argv(settings: TrtllmSettings, out: Path) -> tuple[str, ...]:
    """HF -> TensorRT-LLM checkpoint: this module's `convert` subcommand."""
    return (sys.executable, "-m", MODULE, "convert",
            "--checkpoint", settings.checkpoint_dir, "--out", str(out),
            "--dtype", settings.dtype, "--tp-size", str(settings.tp_size))


def build_argv(settings: TrtllmSettings, checkpoint_dir: Path, draft_model: bool) -> tuple[str, ...]:
    """trtllm-build's command line for one engine (flags: the module docstring)."""
    argv = [TRTLLM_BUILD, "--checkpoint_dir", str(checkpoint_dir), "--output_dir", settings.engine_dir,
            "--max_batch_size", str(settings.max_batch_size), "--max_input_len", str(settings.max_seq_len),
            "--max_seq_len", str(settings.max_seq_len), "--max_num_tokens", str(settings.max_num_tokens),
            "--gemm_plugin", "auto", "--gpt_attention_plugin", "auto", "--remove_input_padding", "enable",
            "--kv_cache_type", "paged", "--use_paged_context_fmha", "enable"]
    if settings.max_draft_len > 0:
        argv += ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", str(settings.max_draft_len)]
    if draft_model:
        argv.append("--gather_generation_logits")
    return tuple(argv)


def build_plan(dep: Deployment) -> list[EngineBuild]:
    """Every TensorRT-LLM model's build, from the settings render.py serves it with. Pure: reads
    config.json files, runs nothing, imports no TensorRT-LLM."""
    models = trtllm_models(dep)
    if not models:
        return []
    configs = {m["name"]: hf_config(m, dep) for m in models}  # before the orchestrator reads the tokenizer
    orchestrator = orchestrator_settings(dep)
    plan = []
    for model in models:
        config = configs[model["name"]]
        model_class_name(config)  # refuse a model TensorRT-LLM's converter is not known for before anything runs
        settings = trtllm_settings(model, dep, orchestrator)
        checkpoint_dir = Path(f"{settings.engine_dir}.ckpt")
        plan.append(EngineBuild(settings, checkpoint_dir, convert=convert_argv(settings, checkpoint_dir),
                                build=build_argv(settings, checkpoint_dir, draft_model=model is not dep.llm),
                                source_digest=hashlib.sha256(config.read_bytes()).hexdigest()))
    return plan


def is_built(build: EngineBuild) -> bool:
    """Whether the engine directory holds an engine built from exactly this plan."""
    stamp = build.engine_dir / STAMP
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return recorded == build.stamp() and (build.engine_dir / ENGINE_FILE).is_file()


def run_build(build: EngineBuild) -> None:
    """Convert and compile one engine, then stamp it. The old stamp goes first, so that a failed
    rebuild is never taken for a finished one."""
    (build.engine_dir / STAMP).unlink(missing_ok=True)
    for step in build.steps:
        log.info("%s: %s", build.name, shlex.join(step))
        subprocess.run(step, check=True)
    (build.engine_dir / STAMP).write_text(json.dumps(build.stamp(), indent=2) + "\n")
    log.info("%s: engine ready in %s", build.name, build.engine_dir)


def build_engines(plan: list[EngineBuild], force: bool = False) -> list[EngineBuild]:
    """Build what is not built from this plan yet (everything with `force`); returns what was built."""
    todo = [b for b in plan if force or not is_built(b)]
    for build in plan:
        if build not in todo:
            log.info("%s: engine in %s is up to date (--force rebuilds it)", build.name, build.engine_dir)
    if todo and shutil.which(TRTLLM_BUILD) is None:
        raise BuildError(f"`{TRTLLM_BUILD}` is not on PATH: {CONTAINER_HINT}")
    for build in todo:
        run_build(build)
    return todo


def convert(checkpoint: Path, out: Path, dtype: str, tp_size: int) -> None:
    """HF checkpoint -> TensorRT-LLM checkpoint (one file of weights per tensor-parallel rank)."""
    try:
        import tensorrt_llm.models
        from tensorrt_llm.mapping import Mapping
    except ImportError as exc:
        raise BuildError(f"tensorrt_llm cannot be imported ({exc}): {CONTAINER_HINT}") from None
    model_class = getattr(tensorrt_llm.models, model_class_name(checkpoint / "config.json"))
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(tp_size):
        mapping = Mapping(world_size=tp_size, rank=rank, tp_size=tp_size, pp_size=1)
        model = model_class.from_hugging_face(str(checkpoint), dtype, mapping=mapping)
        model.save_checkpoint(str(out), save_config=rank == 0)
        del model
    log.info("converted %s to a TensorRT-LLM checkpoint in %s", checkpoint, out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Build the TensorRT-LLM engines of a deployment")
    parser.add_argument("--deploy", default=os.environ.get("DEPLOY", str(ROOT / "deploy.yaml")))
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    sub = parser.add_subparsers(dest="command")
    conv = sub.add_parser("convert", help="one HF checkpoint -> TensorRT-LLM checkpoint (a build step)")
    conv.add_argument("--checkpoint", type=Path, required=True, help="the Hugging Face checkpoint directory")
    conv.add_argument("--out", type=Path, required=True, help="the TensorRT-LLM checkpoint directory")
    conv.add_argument("--dtype", default="bfloat16")
    conv.add_argument("--tp-size", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "convert":
            convert(args.checkpoint, args.out, args.dtype, args.tp_size)
            return
        plan = build_plan(load_or_exit(args.deploy))
        if not plan:
            log.info("%s serves no %s model: nothing to build", args.deploy, EngineKind.TENSORRTLLM)
        elif args.dry_run:
            print("\n".join(shlex.join(step) for build in plan for step in build.steps))
        else:
            build_engines(plan, force=args.force)
    except BuildError as exc:
        raise SystemExit(f"error: {exc}") from None
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"error: `{shlex.join(exc.cmd)}` failed with exit status {exc.returncode}") from None


if __name__ == "__main__":
    main()
