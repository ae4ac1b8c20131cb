"""deploy.yaml -> a ready Triton model repository.

Fills the `${...}` placeholders of the config.pbtxt templates in `model_repository/` (as
tensorrtllm_backend's fill_template.py does) into `build/model_repository/`: each engine model from
its EngineSettings, the `minions` orchestrator from OrchestratorSettings (minions/settings.py holds every
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
    load_or_exit,
    trtllm_engine_dir,
)
from minions.engines.sequence_cache import KV_GROWTH_TOKENS
from minions.engines.tensors import OWN_INPUTS, OWN_OUTPUTS
from minions.errors import InvalidRequest
from minions.serving.inputs import pbtxt_inputs
from minions.settings import EngineKind, EngineSettings, OrchestratorSettings
from minions.trtllm_settings import TrtllmSettings
from minions.speculation.mode import Speculation

log = logging.getLogger(__name__)

TEMPLATES = ROOT / "model_repository"
TENSORRT_LLM_IO = TEMPLATES / "tensorrt_llm_io.pbtxt"
"""The engine models' shared input and output blocks."""


def engine_settings(model: dict, dep: Deployment, orchestrator: OrchestratorSettings) -> EngineSettings:
    """An engine model's settings: its deploy.yaml entry, its model file resolved from `source`, the
    context and the longest draft from the orchestrator's settings."""
    path = ""
    if model["engine"] == EngineKind.TORCH:
        path = str(hf_dir_for(model["source"], dep))
    elif model["engine"] == EngineKind.LLAMACPP:
        path = str(gguf_for(model["source"], dep, model.get("repack")))
    elif model["engine"] == EngineKind.DISTILLED:
        path = str(distilled_dir(model, dep))
    return EngineSettings.from_yaml(model, model_name=model["name"], model_path=path,
                                    max_context=orchestrator.limits.context,
                                    max_draft_tokens=orchestrator.limits.num_draft_tokens)


def trtllm_settings(model: dict, dep: Deployment, orchestrator: OrchestratorSettings) -> TrtllmSettings:
    """A TensorRT-LLM model's settings: its deploy.yaml entry, the checkpoint (`source`) and engine
    directories resolved, the sequence length from the orchestrator's max_context, and draft tokens
    for the verifier (its `max_draft_len`, else the orchestrator's max_num_draft_tokens; SSMs none)."""
    is_llm = model["name"] == dep.llm["name"]
    draft = int(model.get("max_draft_len", orchestrator.limits.num_draft_tokens)) if is_llm else 0
    return TrtllmSettings.from_yaml(model, model_name=model["name"], max_seq_len=orchestrator.limits.context,
                                    checkpoint_dir=str(hf_dir_for(model["source"], dep)),
                                    engine_dir=str(trtllm_engine_dir(model, dep)), max_draft_len=draft)


def orchestrator_settings(dep: Deployment, grpc_url: str | None = None) -> OrchestratorSettings:
    """The orchestrator's settings: the orchestrator section, with the served models, the tokenizer, the KV
    budget and the server's gRPC endpoint (`grpc_url`, else the deployment's) taken from the rest."""
    orch, llm = dep.orchestrator, dep.llm
    engines = [llm, *dep.ssms]
    settings = OrchestratorSettings.from_yaml(
        orch,
        model_name=dep.orchestrator_name,
        llm_model_name=llm["name"],
        ssm_model_names=tuple(s["name"] for s in dep.ssms),
        decoupled_model_names=tuple(m["name"] for m in engines if TEMPLATE_BY_ENGINE[m["engine"]] in DECOUPLED_TEMPLATES),
        trtllm_model_names=tuple(m["name"] for m in engines if m["engine"] == EngineKind.TENSORRTLLM),
        lookup_model_names=tuple(m["name"] for m in dep.ssms
                                 if m["engine"] in (EngineKind.NGRAM, EngineKind.SUFFIX)),
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
    if llm["engine"] == EngineKind.TENSORRTLLM:  # TensorRT-LLM schedules at most max_batch_size sequences at once
        batch = live = TrtllmSettings.from_yaml(llm).max_batch_size
    else:
        engine = EngineSettings.from_yaml(llm)
        batch, live = engine.max_batch_size, engine.max_sequences
    return dataclasses.replace(settings, llm_max_batch_size=batch, llm_max_sequences=live)


def parameter_blocks(params: dict[str, str]) -> str:
    """config.pbtxt `parameters` entries, one per setting (what the model's settings class reads back)."""
    return "".join(f'parameters: {{\n  key: "{k}"\n  value: {{\n    string_value: {json.dumps(v, ensure_ascii=False)}\n  }}\n}}\n'
                   for k, v in params.items())


def _fill(template_dir: Path, out_dir: Path, params: dict[str, str], native: bool = False) -> None:
    """Copy a model's template, its config.pbtxt filled in: placeholders from `params`, every one of them
    as a string parameter (`${parameters}`), so a new setting needs no template change, and the engine
    models' shared tensorrt_llm inputs and outputs (`${tensorrt_llm_io}`; `native`: only tensorrt_llm's own),
    and the `minions` model's inputs (`${minions_inputs}`, serving/inputs.py)."""
    shutil.copytree(template_dir, out_dir, ignore=shutil.ignore_patterns("__pycache__"))
    config = out_dir / "config.pbtxt"
    io = tensorrt_llm_native_io() if native else _tensorrt_llm_io()
    config.write_text(string.Template(config.read_text()).substitute(
        params, parameters=parameter_blocks(params), tensorrt_llm_io=io, minions_inputs=pbtxt_inputs()))


def _tensorrt_llm_io() -> str:
    """The shared input and output blocks, without the file's opening comment."""
    lines = TENSORRT_LLM_IO.read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines).rstrip("\n")


def tensorrt_llm_native_io() -> str:
    """The shared blocks less Minions' own inputs and outputs (engines/tensors.py OWN_INPUTS, OWN_OUTPUTS):
    what TensorRT-LLM's tensorrt_llm model declares. Parsed into Triton's ModelConfig and printed back."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(_tensorrt_llm_io(), model_config_pb2.ModelConfig())
    kept = [i for i in config.input if i.name not in OWN_INPUTS]
    del config.input[:]
    config.input.extend(kept)
    sent = [o for o in config.output if o.name not in OWN_OUTPUTS]
    del config.output[:]
    config.output.extend(sent)
    return text_format.MessageToString(config).rstrip("\n")


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
        template = TEMPLATES / TEMPLATE_BY_ENGINE[model["engine"]]
        if model["engine"] == EngineKind.TENSORRTLLM:
            _fill(template, out_dir / model["name"], trtllm_settings(model, dep, orchestrator).params(), native=True)
        else:
            _fill(template, out_dir / model["name"], engine_settings(model, dep, orchestrator).params())
    _fill(TEMPLATES / "minions", out_dir / orchestrator.model_name, orchestrator.params())
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description="Render the Triton model repository from deploy.yaml")
    parser.add_argument("--deploy", default=os.environ.get("DEPLOY", str(ROOT / "deploy.yaml")))
    parser.add_argument("--out", default=str(ROOT / "build" / "model_repository"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(render_repository(load_or_exit(args.deploy), Path(args.out)))


if __name__ == "__main__":
    main()
