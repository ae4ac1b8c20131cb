"""Which of the project's patches to llama.cpp (patches/llama-cpp-python/) the loaded llama.cpp carries.

`make venv` builds llama-cpp-python from its sdist with them. A llama-cpp-python installed another way
runs the same, but without FLASH_ATTN_ROW_BLOCKS the batch-invariant engines' attention walks a prompt's
cells one at a time, and a token on a long prompt costs up to half as much again; without
`mul-mat-q4-1-tiles` a Q4_1 step of several tokens (a verification, several sequences) costs about a
fifth more, without `tiled-min-batch-avx2` a Q4_K_M step of 8–11 tokens up to 15% more, and
without `mul-mat-small-batch-chunks` a step of 2–4 tokens 5–15% more, and without
`quant-sgemm-min-columns` a Q4_1 file's Q8_0 output layer by 2–7 tokens (a short draft's
verification, a step of a few sequences) 5–15% of the step more (docs/engines.md).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

FLASH_ATTN_ROW_BLOCKS = "flash-attn-row-blocks"
"""Flash attention on a query row in blocks of cells, in the same fixed order (0001-*.patch)."""

MARKER = "ggml_cpu_minions_patches"
"""The function the patches add to libggml-cpu: their names, comma-separated."""


def carried(lib_dir: Path | None = None) -> frozenset[str]:
    """The patch names in the libggml-cpu under `lib_dir` (default: the one llama_cpp loads, which
    `LLAMA_CPP_LIB_PATH` may move); empty for an unpatched build, or one without that file (a build
    whose CPU backend is named otherwise is not checked, nor stopped)."""
    if lib_dir is None:
        from llama_cpp import llama_cpp

        lib_dir = llama_cpp._base_path
    try:
        lib = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"))
    except OSError:
        return frozenset()
    marker = getattr(lib, MARKER, None)
    if marker is None:
        return frozenset()
    marker.restype = ctypes.c_char_p
    return frozenset(name for name in marker().decode().split(",") if name)
