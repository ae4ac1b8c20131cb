"""Matrix products of several tokens give each token the one-token product bit for bit, through the
installed libggml with random weights: Q4_1 in patches/llama-cpp-python's 2 x 2 tiles (0002), Q6_K on
the stock path up to 11 tokens (0003; from 12 on llama.cpp's tiled K-quant kernels take it, and they
round otherwise), Q8_0 (the SmolLM2 GGUF's output layer: column by column up to 7 tokens (0005), in
llamafile's tiles from 8). Each column of a product with 2 to 11
activation columns equals that column's product alone, on 1 to 3 threads. This is what lets a verified
draft keep plain decoding's tokens on the batch-invariant Q4_1 deployment, checked on the ggml
operation itself (end to end on the GGUF: test_llamacpp_batch_invariance)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

GGML_TYPE_F32, GGML_TYPE_Q4_1, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0 = 0, 3, 14, 8
K, M, MAX_COLUMNS = 1536, 64, 11


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    """libggml-base and libggml-cpu as llama_cpp loads them, with the prototypes this test calls."""
    from llama_cpp import llama_cpp

    base = ctypes.CDLL(str(llama_cpp._base_path / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(llama_cpp._base_path / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    p = ctypes.c_void_p
    base.ggml_init.argtypes, base.ggml_init.restype = [InitParams], p
    base.ggml_free.argtypes = [p]
    base.ggml_new_tensor_2d.argtypes, base.ggml_new_tensor_2d.restype = [p, ctypes.c_int, ctypes.c_int64,
                                                                         ctypes.c_int64], p
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [p], p
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_mul_mat.argtypes, base.ggml_mul_mat.restype = [p, p, p], p
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [p], p
    base.ggml_build_forward_expand.argtypes = [p, p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    return base, cpu


def product(ggml, weight_type: int, weights: np.ndarray, x: np.ndarray, threads: int) -> np.ndarray:
    """ggml_mul_mat of the weights (M x K, quantized to `weight_type`) by the columns of x (n x K): n x M."""
    base, cpu = ggml
    ctx = base.ggml_init(InitParams(64 << 20, None, False))
    try:
        w = base.ggml_new_tensor_2d(ctx, weight_type, K, M)
        base.ggml_quantize_chunk(weight_type, weights.ctypes.data, base.ggml_get_data(w), 0, M, K, None)
        a = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, len(x))
        ctypes.memmove(base.ggml_get_data(a), np.ascontiguousarray(x).ctypes.data, x.nbytes)
        y = base.ggml_mul_mat(ctx, w, a)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, threads) == 0
        out = np.empty((len(x), M), dtype=np.float32)
        ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
        return out
    finally:
        base.ggml_free(ctx)


@pytest.mark.parametrize("weight_type", [GGML_TYPE_Q4_1, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0], ids=["Q4_1", "Q6_K", "Q8_0"])
def test_every_column_of_a_product_is_the_one_column_product_bit_for_bit(ggml, weight_type):
    rng = np.random.default_rng(7)
    weights = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    x = rng.uniform(-1, 1, (MAX_COLUMNS, K)).astype(np.float32)
    alone = np.stack([product(ggml, weight_type, weights, x[j:j + 1], 1)[0] for j in range(MAX_COLUMNS)])
    for threads in (1, 2, 3):
        for n in range(2, MAX_COLUMNS + 1):
            together = product(ggml, weight_type, weights, x[:n], threads)
            assert together.tobytes() == alone[:n].tobytes(), f"{n} columns on {threads} threads"
