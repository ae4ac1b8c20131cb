"""The llama.cpp the engines load carries every patch of patches/llama-cpp-python (make venv builds it so),
and the check tells a patched libggml-cpu from one without the patches."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from minions.engines.llamacpp_patches import (
    DISABLE_TILES,
    FLASH_ATTN_ROW_BLOCKS,
    K_QUANT_BATCH_INVARIANT,
    MARKER,
    carried,
    disable_k_quant_tiles,
)
from tests.support.stand_in_library import needs_cc, stand_in_library

PATCHES = Path(__file__).resolve().parents[2] / "patches" / "llama-cpp-python"


def patch_names() -> set[str]:
    """The patches' names: their file names without the order number and `.patch`."""
    return {re.sub(r"^\d+-", "", path.stem) for path in PATCHES.glob("*.patch")}


def test_the_installed_llama_cpp_carries_every_patch():
    assert {FLASH_ATTN_ROW_BLOCKS, K_QUANT_BATCH_INVARIANT} <= patch_names()
    missing = patch_names() - carried()
    assert not missing, f"llama.cpp built without {sorted(missing)}: rebuild with make venv"


def stand_in(folder: Path, source: str) -> Path:
    """The folder of a libggml-cpu.so compiled from `source`."""
    return stand_in_library(folder, "libggml-cpu.so", source).parent


@needs_cc
def test_a_build_without_the_marker_carries_none_and_the_marker_lists_them(tmp_path):
    plain = stand_in(tmp_path / "plain", "int ggml_cpu_has_avx2(void) { return 1; }\n")
    assert carried(plain) == frozenset()
    patched = stand_in(tmp_path / "patched", f'const char * {MARKER}(void) {{ return "one,two"; }}\n')
    assert carried(patched) == {"one", "two"}
    assert carried(tmp_path / "nowhere") == frozenset()


@needs_cc
def test_the_k_quant_tiles_go_off_only_where_the_build_can_turn_them_off(tmp_path):
    plain = stand_in(tmp_path / "plain", "int ggml_cpu_has_avx2(void) { return 1; }\n")
    assert not disable_k_quant_tiles(plain)
    assert not disable_k_quant_tiles(tmp_path / "nowhere")
    patched = stand_in(tmp_path / "patched", f"int off = 0;\nvoid {DISABLE_TILES}(void) {{ off = 1; }}\n")
    assert disable_k_quant_tiles(patched)
    assert ctypes.c_int.in_dll(ctypes.CDLL(str(patched / "libggml-cpu.so")), "off").value == 1
