"""Patch 0001's flash attention (a query row's unmasked cells in blocks, F16 V rows accumulated in F32)
against a numpy reference, through ggml's own graph API on the very llama.cpp the engines load: head
dims 64, 80 and 128, causal and padded masks (a padding row attends to nothing), grouped heads, sinks,
a logit softcap, ALiBi slopes, and the split-KV path of one query over 512 cells or more.

Which kernel runs: with K in Q8_0 (the batch-invariant engines' cache) and V in F16, every query row
takes the patched row loop, as does K in F16 with fewer than 64 queries; with K and V in F16, one query
over 512+ cells takes the split-KV path,
whose chunks run the same loop and are merged after. The reference quantizes Q and K as ggml does
(Q8_0: blocks of 32 codes, scale max|x|/127 kept in F16; F16: rounded), so it differs from the
kernel only by float summation order.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import pytest

from minions.engines.llamacpp_patches import FLASH_ATTN_ROW_BLOCKS, carried, ggml_library

F32, F16, Q8_0 = 0, 1, 8
"""ggml_type values (ggml.h)."""
TOLERANCE = 2e-5
"""Largest difference allowed, relative to the output's largest value: float summation order moves
results by about 1e-6 of it; a cell counted twice, skipped, or rescaled wrongly moves them by 1e-2."""


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _ggml():
    base, cpu = ggml_library("ggml-base"), ggml_library("ggml-cpu")
    if base is None or cpu is None:
        pytest.skip("llama_cpp's ggml libraries are not named libggml-base.so / libggml-cpu.so")
    p, i64, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for name, restype, argtypes in (
            ("ggml_init", p, [_InitParams]), ("ggml_free", None, [p]),
            ("ggml_new_tensor_1d", p, [p, ctypes.c_int, i64]),
            ("ggml_new_tensor_4d", p, [p, ctypes.c_int, i64, i64, i64, i64]),
            ("ggml_cpy", p, [p, p, p]), ("ggml_flash_attn_ext", p, [p, p, p, p, p, f, f, f]),
            ("ggml_flash_attn_ext_add_sinks", None, [p, p]), ("ggml_new_graph", p, [p]),
            ("ggml_build_forward_expand", None, [p, p]), ("ggml_get_data", p, [p]), ("ggml_nbytes", ctypes.c_size_t, [p])):
        function = getattr(base, name)
        function.restype, function.argtypes = restype, argtypes
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    return base, cpu


@dataclass
class Case:
    dim: int
    queries: int
    cells: int
    heads: int = 4
    kv_heads: int = 2
    k_type: int = Q8_0
    mask: str = "causal"
    """causal (query i sees the cells up to cells - queries + i), padded (the last two queries see
    nothing), or none."""
    sinks: bool = False
    softcap: float = 0.0
    max_bias: float = 0.0
    threads: int = 1


def _q8_0(x: np.ndarray) -> np.ndarray:
    """x (last axis a multiple of 32) through ggml's Q8_0 and back."""
    blocks = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    top = np.abs(blocks).max(axis=-1, keepdims=True)
    d = top / np.float32(127)
    inverse = np.divide(np.float32(127), top, out=np.zeros_like(top), where=top != 0)
    codes = np.round(blocks * inverse)  # to nearest even, as ggml's AVX2 quantize_row_q8_0
    return (codes * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def _mask(case: Case) -> np.ndarray | None:
    if case.mask == "none":
        return None
    visible = np.arange(case.cells)[None, :] <= (case.cells - case.queries + np.arange(case.queries))[:, None]
    if case.mask == "padded":
        visible[-2:] = False
    bias = -np.abs(np.arange(case.cells)[None, :] - (case.cells - case.queries + np.arange(case.queries))[:, None])
    return np.where(visible, bias if case.max_bias else 0.0, -np.inf).astype(np.float16)


def _slopes(case: Case) -> np.ndarray:
    if case.max_bias <= 0:
        return np.ones(case.heads, dtype=np.float32)
    log2 = 1 << int(np.floor(np.log2(case.heads)))
    m0, m1 = 2.0 ** (-case.max_bias / log2), 2.0 ** (-case.max_bias / 2 / log2)
    return np.array([m0 ** (h + 1) if h < log2 else m1 ** (2 * (h - log2) + 1) for h in range(case.heads)])


def _reference(case, q, k, v, mask, sinks, scale) -> np.ndarray:
    """[queries, heads, dim]: attention as ggml defines it, in float64 over the kernel's quantized inputs."""
    qd, kd = (_q8_0(q), _q8_0(k)) if case.k_type == Q8_0 else (q.astype(np.float16), k.astype(np.float16))
    qd, kd, vd = qd.astype(np.float64), kd.astype(np.float64), v.astype(np.float64)
    group = case.heads // case.kv_heads
    out = np.zeros((case.queries, case.heads, case.dim))
    slopes = _slopes(case)
    for h in range(case.heads):
        s = qd[h] @ kd[h // group].T * scale
        if case.softcap:
            s = case.softcap * np.tanh(s / case.softcap)
        if mask is not None:
            s = s + slopes[h] * mask.astype(np.float64)
        top = s.max(axis=1, keepdims=True)
        if sinks is not None:
            top = np.maximum(top, sinks[h])
        finite = np.isfinite(top)
        p = np.where(finite, np.exp(s - np.where(finite, top, 0)), 0.0)
        total = p.sum(axis=1, keepdims=True) + (np.exp(sinks[h] - top) if sinks is not None else 0.0)
        out[:, h] = np.divide(p @ vd[h // group], total, out=np.zeros((case.queries, case.dim)), where=total > 0)
    return out


def _ggml_attention(case, q, k, v, mask, sinks, scale) -> np.ndarray:
    base, cpu = _ggml()
    ctx = base.ggml_init(_InitParams(256 * 2**20, None, False))
    assert ctx, "ggml_init failed"
    try:
        def tensor(kind: int, array: np.ndarray | None, *ne: int) -> int:
            t = base.ggml_new_tensor_4d(ctx, kind, *ne, *([1] * (4 - len(ne))))
            if array is not None:
                data = np.ascontiguousarray(array)
                assert data.nbytes == base.ggml_nbytes(t)
                ctypes.memmove(base.ggml_get_data(t), data.ctypes.data, data.nbytes)
            return t

        qt = tensor(F32, q.astype(np.float32), case.dim, case.queries, case.heads)
        if case.k_type == Q8_0:  # quantized by ggml itself, as a KV cache is
            k32 = tensor(F32, k.astype(np.float32), case.dim, case.cells, case.kv_heads)
            kt = base.ggml_cpy(ctx, k32, tensor(Q8_0, None, case.dim, case.cells, case.kv_heads))
        else:
            kt = tensor(F16, k.astype(np.float16), case.dim, case.cells, case.kv_heads)
        vt = tensor(F16, v, case.dim, case.cells, case.kv_heads)
        mt = tensor(F16, mask, case.cells, case.queries) if mask is not None else None
        out = base.ggml_flash_attn_ext(ctx, qt, kt, vt, mt, scale, case.max_bias, case.softcap)
        if sinks is not None:
            base.ggml_flash_attn_ext_add_sinks(out, tensor(F32, sinks, case.heads))
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, case.threads) == 0
        n = case.queries * case.heads * case.dim
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(base.ggml_get_data(out))).copy().reshape(
            case.queries, case.heads, case.dim)
    finally:
        base.ggml_free(ctx)


CASES = [
    Case(64, queries=7, cells=150),
    Case(80, queries=5, cells=200, k_type=F16, mask="padded"),  # (80 is no multiple of Q8_0's 32)
    Case(128, queries=3, cells=130, heads=8, kv_heads=2),
    Case(64, queries=6, cells=140, sinks=True),
    Case(64, queries=4, cells=100, softcap=30.0),
    Case(64, queries=4, cells=100, heads=6, kv_heads=6, max_bias=8.0),
    Case(128, queries=9, cells=300, threads=2),
    Case(64, queries=1, cells=600, k_type=F16, mask="none", threads=2),
    Case(64, queries=1, cells=700, k_type=F16, threads=2, sinks=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: (f"d{c.dim}-q{c.queries}-kv{c.cells}-{c.mask}-h{c.heads}/{c.kv_heads}"
                                                      f"{'-q8_0' if c.k_type == Q8_0 else '-f16'}"
                                                      f"{'-sinks' if c.sinks else ''}{'-softcap' if c.softcap else ''}"
                                                      f"{'-alibi' if c.max_bias else ''}-t{c.threads}"))
def test_the_patched_flash_attention_matches_the_reference(case):
    if not carried().get(FLASH_ATTN_ROW_BLOCKS):
        pytest.skip("this llama.cpp runs upstream's flash attention (no patch 0001, or compiled out)")
    rng = np.random.default_rng(case.dim * 1000 + case.cells)
    q = rng.standard_normal((case.heads, case.queries, case.dim)).astype(np.float32)
    k = rng.standard_normal((case.kv_heads, case.cells, case.dim)).astype(np.float32)
    v = rng.standard_normal((case.kv_heads, case.cells, case.dim)).astype(np.float16)
    sinks = rng.standard_normal(case.heads).astype(np.float32) * 2 if case.sinks else None
    mask, scale = _mask(case), 1 / np.sqrt(case.dim)
    got = _ggml_attention(case, q, k, v, mask, sinks, scale)
    want = _reference(case, q, k, v, mask, sinks, scale)
    if case.mask == "padded":
        assert not got[-2:].any(), "a query that sees no cell attends to nothing"
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < TOLERANCE, f"largest difference {error:.2e} of the output's scale"
