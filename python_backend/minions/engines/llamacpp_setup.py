"""How an engine's llama.cpp model and context are set up: sequences, KV layout, threads, and batch
invariance (EngineSettings.batch_invariant), which is checked before the model loads.

Batch invariance takes the CPUs and patches `llamacpp_patches.invariance_refusal` allows, no GPU
offload (the patches are CPU kernels), K in Q8_0 beside an F16 V with flash attention (so that
attention goes row by row), and llama.cpp's tiled K-quant kernels off in the process.
"""

from __future__ import annotations

import logging

from minions.engines.llamacpp_patches import PATCHES, build_flags, carried, disable_k_quant_tiles, invariance_refusal

log = logging.getLogger(__name__)


def require_batch_invariance() -> None:
    """Raise ValueError where a batch-invariant engine cannot claim exactness; else turn the K-quant
    tiles off, warning about each patch the build lacks or compiled out (that engine runs slower)."""
    patches = carried()
    refusal = invariance_refusal(patches, built=build_flags())
    if refusal:
        raise ValueError(f"batch_invariant: {refusal}: outputs could differ from plain decoding; "
                         "set batch_invariant: false for this model in the deployment")
    slower = [name for name in PATCHES if not patches.get(name, False)]
    if slower:
        log.warning("llama.cpp without the project's %s patches (or compiled out): batch-invariant steps "
                    "run slower, exact still (make venv builds them in)", ", ".join(slower))
    disable_k_quant_tiles()


def model_params(batch_invariant: bool):
    """The model's load parameters: llama.cpp's defaults, kept on the CPU where batch-invariant."""
    from llama_cpp._internals import LlamaModel

    params = LlamaModel.default_params()
    if batch_invariant:
        params.n_gpu_layers = 0
    return params


def context_params(max_sequences: int, n_ctx: int, n_batch: int, num_threads: int, kv_unified: bool,
                   batch_invariant: bool):
    """The context's parameters: `max_sequences` sequences of up to `n_ctx` tokens each (the stepper's
    start() holds each to it). Unified: one KV buffer, any sequences share a ubatch, but every token's
    attention spans every sequence's cells. Per sequence: llama.cpp cuts a step into one ubatch per run
    of consecutive sequence ids with equal token counts, so steps go in slot order and slots are taken
    lowest first (docs/engines.md, EngineSettings.kv_unified)."""
    import llama_cpp
    from llama_cpp._internals import LlamaContext

    params = LlamaContext.default_params()
    params.n_seq_max = max_sequences
    params.kv_unified = kv_unified
    params.n_ctx = n_ctx * max_sequences
    params.n_batch = params.n_ubatch = n_batch
    params.n_threads = params.n_threads_batch = num_threads
    if batch_invariant:
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k, params.type_v = llama_cpp.GGML_TYPE_Q8_0, llama_cpp.GGML_TYPE_F16
    return params
