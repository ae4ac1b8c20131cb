"""Which of the project's patches to llama.cpp (patches/llama-cpp-python/) the loaded llama.cpp carries,
and whether each one's kernel was compiled in.

`make venv` builds llama-cpp-python from its sdist with them. Each patch adds a marker function of its
own to libggml-cpu, `ggml_cpu_minions_<name>`, returning 1 where its code is compiled in and 0 where its
guard left upstream's code (a build for CPUs it was not proven on: no AVX2). A llama-cpp-python
installed another way runs the same, slower where a patch is missing (the costs: docs/engines.md and
the patches' README); a batch-invariant engine needs K_QUANT_BATCH_INVARIANT compiled in
(llamacpp_setup.require_batch_invariance).
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Collection, Mapping
from pathlib import Path

FLASH_ATTN_ROW_BLOCKS = "flash-attn-row-blocks"
"""Flash attention on a query row in blocks of cells, in the same fixed order (0001-*.patch)."""

K_QUANT_BATCH_INVARIANT = "k-quant-batch-invariant"
"""Repacked Q4_K's one-row kernel rounding as its four-row one, and K-quant tiles off on request (0006-*.patch)."""

PATCHES = (FLASH_ATTN_ROW_BLOCKS, "mul-mat-q4-1-tiles", "mul-mat-small-batch-chunks", "quant-sgemm-min-columns",
           K_QUANT_BATCH_INVARIANT, "q6-k-tiles")
"""Every patch's name, in the order they apply (tests/unit/test_llamacpp_patches.py ties it to the folder)."""

PROVEN_ON = ("x86_64", frozenset({"avx2", "fma", "f16c"}))
"""The CPUs the patches' batch invariance was proven on (machine, instruction sets its flags must show):
their kernels elsewhere (NEON, i8mm, AVX-512 paths, a GPU) round otherwise (issue 66's reading)."""


DISABLE_TILES = "ggml_cpu_minions_disable_tiled_mm"
"""The function K_QUANT_BATCH_INVARIANT adds: llama.cpp's tiled K-quant kernels off in this process."""


def marker(name: str) -> str:
    """The function patch `name` adds to libggml-cpu: 1 where its code was compiled in, 0 where guarded out."""
    return "ggml_cpu_minions_" + name.replace("-", "_")


@functools.cache
def ggml_library(name: str, lib_dir: Path | None = None) -> ctypes.CDLL | None:
    """`lib<name>.so` under `lib_dir`; by default the very copy llama_cpp runs (its folder, which
    `LLAMA_CPP_LIB_PATH` may move, holds each library as several files, `.so`, `.so.0`, ...: loading
    another of them would map a second copy with state of its own). None without the file (a build
    whose libraries are named otherwise is not checked, nor stopped). Looked up once per process: a
    batch-invariant engine asks for libggml-cpu twice as it starts (`carried`, `disable_k_quant_tiles`)."""
    if lib_dir is None:
        from llama_cpp import llama_cpp  # loads libllama and the ggml libraries it links

        lib_dir = llama_cpp._base_path
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = Path(line.split(maxsplit=5)[-1])
            if path.parent == lib_dir and path.name.startswith(f"lib{name}.so"):
                return ctypes.CDLL(str(path))
    try:
        return ctypes.CDLL(str(lib_dir / f"lib{name}.so"))
    except OSError:
        return None


def carried(lib_dir: Path | None = None) -> dict[str, bool]:
    """The patches in the libggml-cpu under `lib_dir` (default: the one llama_cpp loads), each with whether
    its code was compiled in (False: its guard kept upstream's code on this build); empty for an
    unpatched build, or one without that file (not checked, nor stopped)."""
    lib = ggml_library("ggml-cpu", lib_dir)
    found = {}
    for name in PATCHES:
        function = getattr(lib, marker(name), None)
        if function is not None:
            function.restype = ctypes.c_int
            found[name] = bool(function())
    return found


def disable_k_quant_tiles(lib_dir: Path | None = None) -> bool:
    """Turn llama.cpp's tiled K-quant products off for this process, for good: they round otherwise
    than the one-token kernels, so a batch-invariant engine cannot have them. Every engine of the
    process then multiplies K-quants without them (their prompts cost about a tenth more on AVX2;
    other types are untouched). False where the build lacks K_QUANT_BATCH_INVARIANT."""
    disable = getattr(ggml_library("ggml-cpu", lib_dir), DISABLE_TILES, None)
    if disable is None:
        return False
    disable.restype = None
    disable()
    return True


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's instruction-set flags (x86's `flags`, ARM's `Features`); empty where unreadable."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def build_flags(lib_dir: Path | None = None) -> frozenset[str] | None:
    """The instruction sets of PROVEN_ON that the libggml-cpu under `lib_dir` was compiled for (its
    `ggml_cpu_has_<set>`: compile-time answers); None where the library does not say (not checked)."""
    lib = ggml_library("ggml-cpu", lib_dir)
    functions = {flag: getattr(lib, f"ggml_cpu_has_{flag}", None) for flag in PROVEN_ON[1]}
    if lib is None or any(f is None for f in functions.values()):
        return None
    for function in functions.values():
        function.restype = ctypes.c_int
    return frozenset(flag for flag, function in functions.items() if function())


def invariance_refusal(patches: Mapping[str, bool], machine: str | None = None,
                       flags: Collection[str] | None = None, built: Collection[str] | None = None) -> str | None:
    """Why a batch-invariant llama.cpp engine cannot claim exactness here, or None: the CPU must be one
    the patches were proven on (PROVEN_ON), the build compiled for those instruction sets (`built`,
    build_flags: elsewhere the patches' guarded paths are compiled out and upstream's kernels run),
    and the build must carry K_QUANT_BATCH_INVARIANT compiled in (`patches`, carried: without it K-quant
    products depend on the batch)."""
    machine = machine if machine is not None else platform.machine()
    flags = frozenset(flags if flags is not None else cpu_flags())
    proven_machine, proven_flags = PROVEN_ON
    if machine != proven_machine or not proven_flags <= flags:
        missing = ", ".join(sorted(proven_flags - flags)) or "none"
        return (f"batch invariance is proven on {proven_machine} with {', '.join(sorted(proven_flags))} only; this "
                f"CPU is {machine} (missing: {missing})")
    if built is not None and not proven_flags <= frozenset(built):
        return (f"the llama.cpp build was compiled without {', '.join(sorted(proven_flags - frozenset(built)))} "
                "(e.g. -DGGML_AVX2=OFF), where the patches' kernels give way to upstream's")
    if not patches.get(K_QUANT_BATCH_INVARIANT, False):
        return (f"the llama.cpp build lacks the project's {K_QUANT_BATCH_INVARIANT} patch (make venv builds it in; "
                "patches/llama-cpp-python/README.md)")
    return None
