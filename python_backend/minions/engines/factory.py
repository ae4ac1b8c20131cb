"""Building an engine from its model's settings (pure: no Triton).

The defaults are EngineSettings' (minions/settings.py); the engine model reads them from its
config.pbtxt with `EngineSettings.from_params`. Each engine's module is imported only when used, so
a model never loads torch or llama.cpp that it does not run.
"""

from __future__ import annotations

from minions.engines.api import Engine
from minions.settings import EngineKind, EngineSettings


def build_engine(settings: EngineSettings, step_lock_path: str | None = None) -> Engine:
    """The engine `settings.engine` names (an EngineKind other than tensorrtllm), built from `settings`.
    `step_lock_path`: a file the model's instances share, whose lock a llama.cpp engine holds for each
    step (engines/step_lock.py)."""
    kind = settings.engine
    if kind in (EngineKind.TORCH, EngineKind.DISTILLED):
        import torch

        from minions.engines.torch_engine import TorchEngine
        from minions.engines.torch_inflight import InflightTorchEngine

        torch.set_num_threads(settings.num_threads)
        if kind == EngineKind.TORCH:
            from minions.engines.torch_models import load_causal_lm

            model = load_causal_lm(settings.model_path, settings.dtype, device=settings.device)
            graphs = {"graph_rows": settings.max_batch_size if settings.cuda_graphs else 0,
                      "graph_draft_tokens": settings.max_draft_tokens,
                      "graph_memory_bytes": int(settings.cuda_graph_memory_mb * 2**20)}
            engine = TorchEngine(model, settings.max_sequences, settings.max_context, settings.min_forward_tokens,
                                 **_torch_caches(settings), **graphs)
        else:
            from minions.engines.distilled_model import load_draft_model

            # min_forward_tokens (padding small passes) is the `torch` engine's setting only.
            engine = TorchEngine(load_draft_model(settings.model_path), settings.max_sequences,
                                 settings.max_context, **_torch_caches(settings))
        return InflightTorchEngine(engine, settings.max_batch_size)
    if kind == EngineKind.LLAMACPP:
        from minions.engines.llamacpp_engine import LlamaCppEngine

        return LlamaCppEngine(settings.model_path, settings.num_threads, max_sequences=settings.max_sequences,
                              n_ctx=settings.max_context, draft_min_prob=settings.draft_min_prob,
                              prefix_caching=settings.prefix_caching,
                              prefix_cache_ram_mib=settings.prefix_cache_ram_mib, kv_unified=settings.kv_unified,
                              batch_invariant=settings.batch_invariant, step_lock_path=step_lock_path)
    if kind == EngineKind.NGRAM:
        from minions.engines.ngram_engine import NgramEngine

        return NgramEngine(settings.max_ngram, settings.min_ngram, spec_factor=settings.ngram_spec_factor,
                           min_confidence=settings.lookup_min_confidence, settle_margin=settings.max_draft_tokens)
    if kind == EngineKind.SUFFIX:
        from minions.engines.suffix_engine import SuffixEngine

        return SuffixEngine(max_match=settings.suffix_max_match, min_match=settings.suffix_min_match,
                            min_prob=settings.suffix_min_prob, corpus_tokens=settings.suffix_corpus_tokens,
                            max_sequences=settings.max_sequences, spec_factor=settings.suffix_spec_factor,
                            min_confidence=settings.lookup_min_confidence,
                            settle_margin=settings.max_draft_tokens)
    raise ValueError(f"engine {kind!r} is not run by minions.engines (one of {EngineKind.listed()}; "
                     f"{EngineKind.TENSORRTLLM} is Triton's own backend)")


def _torch_caches(settings: EngineSettings) -> dict:
    """A TorchEngine's KV bounds and prefix cache, from the model's settings."""
    return dict(kv_budget_bytes=settings.kv_budget_bytes(), prefix_caching=settings.prefix_caching,
                prefix_cache_bytes=int(settings.prefix_cache_ram_mib * 2**20))
