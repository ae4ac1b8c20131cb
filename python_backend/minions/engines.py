"""Building an engine from the string parameters of its config.pbtxt (pure: no Triton)."""

from __future__ import annotations

from collections.abc import Mapping

from .engine_api import Engine


def kv_budget_bytes(params: Mapping[str, str]) -> int | None:
    """`kv_budget_mb` (0 or absent: unbounded) in bytes."""
    mb = float(params.get("kv_budget_mb", 0) or 0)
    return int(mb * 2**20) if mb > 0 else None


def build_engine(params: Mapping[str, str]) -> Engine:
    kind = params.get("engine", "")
    if kind == "torch":
        import torch

        from .torch_engine import TorchEngine, load_causal_lm

        torch.set_num_threads(int(params.get("num_threads", 2)))
        model = load_causal_lm(params["model_path"], params.get("dtype", "float32"))
        return TorchEngine(
            model,
            int(params.get("max_sequences", 8)),
            int(params.get("max_context", 2048)),
            int(params.get("min_forward_tokens", 1)),
            kv_budget_bytes(params),
        )
    if kind == "distilled":
        import torch

        from .distill.draft_model import load_draft_model
        from .torch_engine import TorchEngine

        torch.set_num_threads(int(params.get("num_threads", 2)))
        return TorchEngine(load_draft_model(params["model_path"]), int(params.get("max_sequences", 8)),
                           int(params.get("max_context", 2048)), kv_budget_bytes=kv_budget_bytes(params))
    if kind == "llamacpp":
        from .llamacpp_engine import LlamaCppEngine

        return LlamaCppEngine(
            params["model_path"],
            int(params.get("num_threads", 2)),
            int(params.get("max_sequences", 4)),
            int(params.get("max_context", 2048)),
            float(params.get("draft_min_prob", 0.0)),
        )
    if kind == "ngram":
        from .ngram_engine import NgramEngine

        return NgramEngine(int(params.get("max_ngram", 3)), int(params.get("min_ngram", 1)))
    raise ValueError(f"unknown engine {kind!r}: use torch, distilled, llamacpp or ngram")
