"""Matrix products of several tokens give each token the one-token product bit for bit, through the
installed libggml with random weights, as llama.cpp's CPU backend computes them: Q4_1 in
patches/llama-cpp-python's 2 x 2 tiles (0002), Q6_K on the stock path up to 5 tokens and in the tiles of
0007 from 6 (on AVX2 builds up to 255 tokens: from 256 on llama.cpp's tiled K-quant kernels take it, and
they round otherwise), Q8_0 (the SmolLM2 GGUF's output layer: column by column up to 7 tokens (0005), in llamafile's
tiles from 8), and with the K-quant tiles turned off as a batch-invariant engine does (0006) Q6_K and Q4_K
at any count, Q4_K also repacked at load (its one-token kernel rounding as its four-token one). Each
column of a product with 2 to n activation columns equals that column's product alone, on 1 to 3
threads. This is what lets a verified draft keep plain decoding's tokens on the batch-invariant
deployments, checked on the ggml operation itself (end to end on the SmolLM2 GGUF:
test_llamacpp_batch_invariance)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from minions.engines.llamacpp_patches import disable_k_quant_tiles, ggml_library

GGML_TYPE_F32, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K = 0, 3, 8, 12, 14
GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 0, 1
K, M = 1536, 64


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _prototypes(lib: ctypes.CDLL, table: dict) -> None:
    for name, (args, result) in table.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result


@pytest.fixture(scope="module")
def ggml():
    """The libggml-base, libggml-cpu and libggml that llama_cpp runs, with the prototypes this test calls."""
    base, cpu, backend = (ggml_library(name) for name in ("ggml-base", "ggml-cpu", "ggml"))
    p, i64, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    _prototypes(base, {
        "ggml_init": ([InitParams], p), "ggml_free": ([p], None), "ggml_tensor_overhead": ([], size),
        "ggml_graph_overhead": ([], size), "ggml_row_size": ([ctypes.c_int, i64], size),
        "ggml_new_tensor_2d": ([p, ctypes.c_int, i64, i64], p), "ggml_mul_mat": ([p, p, p], p),
        "ggml_quantize_chunk": ([ctypes.c_int, p, p, i64, i64, i64, p], size),
        "ggml_new_graph": ([p], p), "ggml_build_forward_expand": ([p, p], None),
        "ggml_backend_alloc_ctx_tensors_from_buft": ([p, p], p), "ggml_backend_buffer_free": ([p], None),
        "ggml_backend_buffer_set_usage": ([p, ctypes.c_int], None), "ggml_backend_buft_name": ([p], ctypes.c_char_p),
        "ggml_backend_tensor_set": ([p, p, size, size], None), "ggml_backend_tensor_get": ([p, p, size, size], None),
        "ggml_backend_dev_backend_reg": ([p], p), "ggml_backend_reg_get_proc_address": ([p, ctypes.c_char_p], p),
        "ggml_backend_dev_init": ([p, ctypes.c_char_p], p), "ggml_backend_free": ([p], None),
        "ggml_backend_graph_compute": ([p, p], ctypes.c_int),
    })
    _prototypes(cpu, {"ggml_backend_cpu_buffer_type": ([], p),
                      "ggml_backend_cpu_set_n_threads": ([p, ctypes.c_int], None)})
    _prototypes(backend, {"ggml_backend_dev_by_type": ([ctypes.c_int], p)})
    return base, cpu, backend


def _repack_buffer_type(ggml, device) -> int:
    """The CPU backend's CPU_REPACK buffer type: weights put there are repacked as llama.cpp loads them."""
    base, _, _ = ggml
    address = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(device),
                                                     b"ggml_backend_dev_get_extra_bufts")
    extra = ctypes.cast(address, ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p))(device)
    types = []
    while extra[len(types)]:
        types.append(extra[len(types)])
    named = [t for t in types if base.ggml_backend_buft_name(t) == b"CPU_REPACK"]
    assert named, "this libggml-cpu has no CPU_REPACK buffer type"
    return named[0]


def product(ggml, weight_type: int, weights: np.ndarray, x: np.ndarray, threads: int, repack: bool = False
            ) -> np.ndarray:
    """ggml_mul_mat of the weights (rows x K, quantized to `weight_type`, repacked if asked) by the columns
    of x (n x K) on the CPU backend: n x rows."""
    rows = len(weights)
    base, cpu, backend = ggml
    device = backend.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    be = base.ggml_backend_dev_init(device, None)
    cpu.ggml_backend_cpu_set_n_threads(be, threads)
    weight_ctx = base.ggml_init(InitParams(base.ggml_tensor_overhead() * 2, None, True))
    ctx = base.ggml_init(InitParams(base.ggml_tensor_overhead() * 4 + base.ggml_graph_overhead(), None, True))
    buffers = []
    try:
        w = base.ggml_new_tensor_2d(weight_ctx, weight_type, K, rows)
        buffer_type = _repack_buffer_type(ggml, device) if repack else cpu.ggml_backend_cpu_buffer_type()
        buffers.append(base.ggml_backend_alloc_ctx_tensors_from_buft(weight_ctx, buffer_type))
        base.ggml_backend_buffer_set_usage(buffers[-1], GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        quantized = np.empty(base.ggml_row_size(weight_type, K) * rows, dtype=np.uint8)
        base.ggml_quantize_chunk(weight_type, weights.ctypes.data, quantized.ctypes.data, 0, rows, K, None)
        base.ggml_backend_tensor_set(w, quantized.ctypes.data, 0, quantized.nbytes)
        a = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, len(x))
        y = base.ggml_mul_mat(ctx, w, a)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, y)
        buffers.append(base.ggml_backend_alloc_ctx_tensors_from_buft(ctx, cpu.ggml_backend_cpu_buffer_type()))
        x = np.ascontiguousarray(x, dtype=np.float32)
        base.ggml_backend_tensor_set(a, x.ctypes.data, 0, x.nbytes)
        assert base.ggml_backend_graph_compute(be, graph) == 0
        out = np.empty((len(x), rows), dtype=np.float32)
        base.ggml_backend_tensor_get(y, out.ctypes.data, 0, out.nbytes)
        return out
    finally:
        for buffer in buffers:
            base.ggml_backend_buffer_free(buffer)
        base.ggml_free(ctx)
        base.ggml_free(weight_ctx)
        base.ggml_backend_free(be)


def assert_columns_equal_alone(ggml, weight_type: int, max_columns: int, repack: bool = False, rows: int = M) -> None:
    rng = np.random.default_rng(7)
    weights = rng.uniform(-1, 1, (rows, K)).astype(np.float32)
    x = rng.uniform(-1, 1, (max_columns, K)).astype(np.float32)
    alone = np.stack([product(ggml, weight_type, weights, x[j:j + 1], 1, repack)[0] for j in range(max_columns)])
    for threads in (1, 2, 3):
        for n in range(2, max_columns + 1):
            together = product(ggml, weight_type, weights, x[:n], threads, repack)
            assert together.tobytes() == alone[:n].tobytes(), f"{n} columns on {threads} threads"


@pytest.mark.parametrize("weight_type, max_columns", [(GGML_TYPE_Q4_1, 11), (GGML_TYPE_Q6_K, 20), (GGML_TYPE_Q8_0, 11)],
                         ids=["Q4_1", "Q6_K", "Q8_0"])
def test_every_column_of_a_product_is_the_one_column_product_bit_for_bit(ggml, weight_type, max_columns):
    """With llama.cpp's tiled K-quant kernels on (before the test below turns them off): Q6_K's exact
    tiles (0007) take 6 to 255 tokens from them."""
    assert_columns_equal_alone(ggml, weight_type, max_columns)


@pytest.mark.parametrize("weight_type, repack, rows",
                         [(GGML_TYPE_Q4_K, True, M), (GGML_TYPE_Q4_K, False, M), (GGML_TYPE_Q6_K, False, 69)],
                         ids=["Q4_K-repacked", "Q4_K", "Q6_K"])
def test_k_quant_products_without_tiles_are_the_one_column_product_at_any_count(ggml, weight_type, repack, rows):
    """The K-quant tiles go off for the rest of this process: what a batch-invariant engine does to its own.
    20 columns: the repacked Q4_K kernel's groups of 16 and of 4 tokens, and the lone ones after them;
    Q6_K's tiles (0007) of 16 rows by 16 columns in steps of two rows by four columns, and their edges
    (69 rows: a last tile of 5, one row alone)."""
    assert disable_k_quant_tiles(), "llama.cpp built without patches/llama-cpp-python's k-quant-batch-invariant"
    assert_columns_equal_alone(ggml, weight_type, 20, repack, rows)
