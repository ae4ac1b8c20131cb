"""deploy.yaml -> a ready Triton model repository.

Fills the `${...}` placeholders of the config.pbtxt templates in `model_repository/` (as
tensorrtllm_backend's fill_template.py does) into `build/model_repository/`: each engine model from
its EngineSettings, the `minions` BLS from OrchestratorSettings (minions/settings.py holds every
default), with model paths, names and budgets resolved from the rest of the deployment.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import string
from pathlib import Path

from minions.deploy.artifacts import (
    gguf_for,
    hf_dir_for,
    kv_budget_tokens,
    tokenizer_dir_for,
)
from minions.deploy.config import (
    DECOUPLED_TEMPLATES,
    ROOT,
    TEMPLATE_BY_ENGINE,
    Deployment,
    ServerPorts,
    distilled_dir,
    load_deployment,
)
from minions.engines.sequence_cache import KV_GROWTH_TOKENS
from minions.errors import InvalidRequest
from minions.settings import EngineSettings, OrchestratorSettings
from minions.speculation.mode import Speculation

log = logging.getLogger(__name__)

TEMPLATES = ROOT / "model_repository"
TENSORRT_LLM_IO = TEMPLATES / "tensorrt_llm_io.pbtxt"
"""The engine models' shared input and output blocks."""


def engine_settings(model: dict, dep: Deployment, max_context: int) -> EngineSettings:
    """An engine model's settings: its deploy.yaml entry, its model file resolved from `source`."""
    path = ""
    if model["engine"] == "torch":
        path = str(hf_dir_for(model["source"], dep))
    elif model["engine"] == "llamacpp":
        path = str(gguf_for(model["source"], dep, model.get("repack")))
    elif model["engine"] == "distilled":
        path = str(distilled_dir(model, dep))
    return EngineSettings.from_yaml(model, model_name=model["name"], model_path=path, max_context=max_context)


def orchestrator_settings(dep: Deployment, grpc_url: str | None = None) -> OrchestratorSettings:
    """The BLS's settings: the orchestrator section, with the served models, the tokenizer, the KV
    budget and the server's gRPC endpoint (`grpc_url`, else the deployment's) taken from the rest."""
    orch, llm = dep.orchestrator, dep.llm
    engines = [llm, *dep.ssms]
    settings = OrchestratorSettings.from_yaml(
        orch,
        model_name=orch.get("name", OrchestratorSettings.model_name),
        llm_model_name=llm["name"],
        ssm_model_names=tuple(s["name"] for s in dep.ssms),
        decoupled_model_names=tuple(m["name"] for m in engines if TEMPLATE_BY_ENGINE[m["engine"]] in DECOUPLED_TEMPLATES),
        tokenizer_path=str(tokenizer_dir_for(llm["source"], dep)),
        kv_budget_tokens=kv_budget_tokens(dep),
        kv_chunk_tokens=KV_GROWTH_TOKENS,
        engine_grpc_url=grpc_url or ServerPorts.of(dep).loopback_grpc_url,
    )
    try:
        settings.check()
    except ValueError as exc:
        raise ValueError(f"{dep.path}: orchestrator: {exc}") from None
    try:
        Speculation.parse(settings.default_speculation, settings.ssm_model_names)
    except InvalidRequest as exc:
        raise ValueError(f"{dep.path}: orchestrator.default_speculation: {exc}") from None
    llm_settings = EngineSettings.from_yaml(llm)
    if not settings.draft_pool_size:  # at most one LLM batch of drafts waits
        settings = dataclasses.replace(settings, draft_pool_size=llm_settings.max_batch_size)
    if not settings.max_active_requests:  # one live sequence per request in the LLM, never evicted
        settings = dataclasses.replace(settings, max_active_requests=llm_settings.max_sequences)
    return settings


def parameter_blocks(params: dict[str, str]) -> str:
    """config.pbtxt `parameters` entries, one per setting (what the model's settings class reads back)."""
    return "".join(f'parameters: {{\n  key: "{k}"\n  value: {{\n    string_value: {json.dumps(v, ensure_ascii=False)}\n  }}\n}}\n'
                   for k, v in params.items())


def _fill(template_dir: Path, out_dir: Path, params: dict[str, str]) -> None:
    """Copy a model's template, its config.pbtxt filled in: placeholders from `params`, every one of them
    as a string parameter (`${parameters}`), so a new setting needs no template change, and the engine
    models' shared tensorrt_llm inputs and outputs (`${tensorrt_llm_io}`)."""
    shutil.copytree(template_dir, out_dir, ignore=shutil.ignore_patterns("__pycache__"))
    config = out_dir / "config.pbtxt"
    config.write_text(string.Template(config.read_text()).substitute(
        params, parameters=parameter_blocks(params), tensorrt_llm_io=_tensorrt_llm_io()))


def _tensorrt_llm_io() -> str:
    """The shared input and output blocks, without the file's opening comment."""
    lines = TENSORRT_LLM_IO.read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines).rstrip("\n")


def render_repository(dep: Deployment, out_dir: Path, grpc_url: str | None = None) -> Path:
    """Write a complete model repository for the deployment, for a server whose gRPC endpoint is
    `grpc_url` (default: the deployment's server section); returns its path."""
    orchestrator = orchestrator_settings(dep, grpc_url)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for model in dep.missing_ssms:
        log.warning("SSM %s not served: %s is missing (run `make distill`)", model["name"], distilled_dir(model, dep))
    for model in [dep.llm, *dep.ssms]:
        settings = engine_settings(model, dep, orchestrator.max_context)
        _fill(TEMPLATES / TEMPLATE_BY_ENGINE[model["engine"]], out_dir / model["name"], settings.params())
    _fill(TEMPLATES / "minions", out_dir / orchestrator.model_name, orchestrator.params())
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description="Render the Triton model repository from deploy.yaml")
    parser.add_argument("--deploy", default=os.environ.get("DEPLOY", str(ROOT / "deploy.yaml")))
    parser.add_argument("--out", default=str(ROOT / "build" / "model_repository"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(render_repository(load_deployment(args.deploy), Path(args.out)))


if __name__ == "__main__":
    main()
