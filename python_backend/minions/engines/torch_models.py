"""Loading a transformers causal LM for the torch engine: its device and weights, never from a hub."""

from __future__ import annotations

import torch


def torch_device(name: str) -> torch.device:
    """deploy.yaml's `device`: cpu, cuda, cuda:N, or auto (cuda when a GPU is visible)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no CUDA GPU (use cpu or auto)")
    return device


def load_causal_lm(path: str, dtype: str = "float32", gguf_file: str | None = None, device: str = "cpu"):
    """Load a transformers model from a local directory (or a GGUF file in it) onto `device`; never downloads."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, gguf_file=gguf_file, dtype=getattr(torch, dtype), local_files_only=True
    )
    return model.to(torch_device(device)).eval()
