"""A model served by Triton's own `tensorrtllm` backend: its config.pbtxt and its engine build's settings,
on the same machinery as every other model's (settings_fields.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minions.settings_fields import Settings, derived, ranged


@dataclass(frozen=True)
class TrtllmSettings(Settings):
    """One model served by Triton's `tensorrtllm` backend (deploy.yaml `engine: tensorrtllm`): what its
    config.pbtxt says and what its engine is built with (minions.deploy.trtllm_build), from one place."""

    model_name: str = derived("")
    checkpoint_dir: str = derived("")
    """The Hugging Face checkpoint (the entry's `source`), resolved by the renderer."""
    engine_dir: str = ""
    """Where the built engine lives (`gpt_model_path`): the entry's `engine_dir`, else <cache_dir>/trtllm/<name>."""
    dtype: str = "bfloat16"
    max_batch_size: int = ranged(64, 1)
    max_queue_delay_us: int = 0
    max_seq_len: int = derived(2048)
    """Set from orchestrator.max_context by the renderer."""
    max_num_tokens: int = ranged(8192, 1)
    """Tokens of one engine step (context chunks and generation together)."""
    max_draft_len: int = 0
    """The LLM verifier: draft tokens one request may carry (orchestrator.max_num_draft_tokens unless set;
    built with --speculative_decoding_mode draft_tokens_external). SSMs: 0."""
    tp_size: int = ranged(1, 1)
    kv_cache_free_gpu_mem_fraction: float = ranged(0.5, 0, 1)
    """Of the GPU memory free once the weights are loaded; models load one after another, so a later
    model's fraction is of what the earlier ones left."""
    enable_kv_cache_reuse: bool = True
    """Rounds resend the whole sequence: block reuse makes that a prefix-cache hit (needs paged context FMHA)."""
    enable_chunked_context: bool = True
    batching_strategy: str = "inflight_fused_batching"
    batch_scheduler_policy: str = "max_utilization"
    gpu_device_ids: str = ""
    """Comma-separated CUDA devices (empty: all visible)."""
