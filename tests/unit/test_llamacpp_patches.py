"""The llama.cpp the engines load carries every patch of patches/llama-cpp-python (make venv builds it so),
and the check tells a patched libggml-cpu from one without the patches."""

from __future__ import annotations

import ctypes
import hashlib
import platform
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

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


SDIST_CACHE = PATCHES.parents[1] / ".cache" / "llama-cpp-python"


def pinned_sdist() -> tuple[str, str]:
    """The sdist requirements.txt pins, and the sha256 patches/llama-cpp-python/sdist.sha256 pins for it."""
    requirements = (PATCHES.parents[1] / "requirements.txt").read_text()
    version = re.search(r"^llama-cpp-python==([^\s;#]+)", requirements, re.MULTILINE)[1]
    archive = f"llama_cpp_python-{version}.tar.gz"
    hashes = dict(reversed(line.split()) for line in (PATCHES / "sdist.sha256").read_text().splitlines() if line)
    assert archive in hashes, f"sdist.sha256 pins no hash for {archive}, which requirements.txt pins"
    return archive, hashes[archive]


def pristine_source(folder: Path) -> Path:
    """The pinned sdist (its hash checked) extracted into `folder`; skips where `make venv` has not left
    the sdist."""
    archive, sha256 = pinned_sdist()
    path = SDIST_CACHE / archive
    if not path.is_file():
        pytest.skip(f"{path} is not there (make venv downloads it)")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    with tarfile.open(path) as tar:
        tar.extractall(folder)  # the pinned sdist, its hash checked above
    return folder / archive.removesuffix(".tar.gz")


def patched_source(folder: Path) -> Path:
    """`pristine_source` with every patch applied by apply.sh, as install.sh applies them, each without
    fuzz or offset."""
    source = pristine_source(folder)
    applied = subprocess.run([str(PATCHES / "apply.sh"), str(source)], capture_output=True, text=True)
    assert applied.returncode == 0 and "offset" not in applied.stdout, applied.stdout
    return source


def test_the_sdist_install_sh_builds_is_pinned_and_every_patch_applies_without_fuzz(tmp_path):
    """install.sh refuses another sdist than the pinned one and applies the patches with --fuzz=0;
    `make venv` leaves the sdist in .cache/llama-cpp-python, where this checks both."""
    assert (patched_source(tmp_path) / "vendor" / "llama.cpp").is_dir()


def test_the_rebase_check_applies_every_patch_in_order_and_takes_a_rebased_one_where_given(tmp_path):
    """rebase-check.sh, the first step onto a newer llama.cpp: on the pinned source every patch applies;
    a patch in the rebased folder is taken instead of the folder's own, and one that does not apply
    fails the check by name."""
    tree = pristine_source(tmp_path / "src") / "vendor" / "llama.cpp"
    check = PATCHES / "rebase-check.sh"
    ok = subprocess.run([str(check), str(tree)], capture_output=True, text=True)
    names = sorted(p.name for p in PATCHES.glob("*.patch"))
    assert ok.returncode == 0 and ok.stdout.split() == [w for n in names for w in ("applies:", n)], ok.stdout
    rebased = tmp_path / "rebased"
    rebased.mkdir()
    (rebased / names[2]).write_text((PATCHES / names[2]).read_text().replace("ggml_cpu_minions_patches", "elsewhere"))
    bad = subprocess.run([str(check), str(tree), str(rebased)], capture_output=True, text=True)
    assert bad.returncode == 1 and f"FAILS:   {names[2]} (rebased)" in bad.stdout, bad.stdout


def compile_x86_quants(source: Path) -> subprocess.CompletedProcess:
    """The patched x86 quants.c compiled as a release build for AVX2 (asserts off), syntax and types only."""
    ggml = source / "vendor" / "llama.cpp" / "ggml"
    return subprocess.run(["cc", "-std=gnu11", "-fsyntax-only", "-mavx2", "-mfma", "-mf16c", "-DNDEBUG",
                           f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}",
                           str(ggml / "src" / "ggml-cpu" / "arch" / "x86" / "quants.c")],
                          capture_output=True, text=True)


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="0007 is x86 code")
def test_0007s_tile_is_tied_to_the_q6_k_block_size_in_a_release_build(tmp_path):
    """0007's tile holds one Q6_K super block on the stack; a release build drops its assert(), so a
    static_assert ties the tile to QK_K: a llama.cpp whose block size changed fails to build instead of
    overflowing the tile."""
    source = patched_source(tmp_path)
    built = compile_x86_quants(source)
    assert built.returncode == 0, built.stderr[-3000:]
    common = source / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-common.h"
    common.write_text(common.read_text().replace("#define QK_K 256", "#define QK_K 512", 1))
    built = compile_x86_quants(source)
    assert built.returncode != 0 and "q6k_tile_block holds a Q6_K super block" in built.stderr, built.stderr[-3000:]


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the guard is tested with x86 flags")
def test_0001s_row_blocks_are_compiled_only_where_they_were_proven(tmp_path):
    """0001's blocks (and its F32 accumulator) are built for AVX2 + F16C + FMA only, where their batch
    invariance was proven; a build without them (`-DGGML_AVX2=OFF`, NEON) runs upstream's loop."""
    source = patched_source(tmp_path)
    ggml = source / "vendor" / "llama.cpp" / "ggml"

    def preprocessed(*flags: str) -> str:
        run = subprocess.run(["c++", "-std=c++17", "-E", *flags, f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
                              f"-I{ggml / 'src' / 'ggml-cpu'}", str(ggml / "src" / "ggml-cpu" / "ops.cpp")],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        return run.stdout

    proven, other = preprocessed("-mavx2", "-mfma", "-mf16c"), preprocessed("-mavx", "-mno-avx2", "-mno-fma")
    assert "s_blk[n] = s + mv" in proven and "s_blk[n] = s + mv" not in other
    assert "VKQ32[d] = " not in proven and "VKQ32[d] = " in other, "upstream's F16 accumulator is widened at the end"
