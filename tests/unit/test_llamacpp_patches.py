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

from minions.engines.llamacpp_patches import DISABLE_TILES, PATCHES, carried, disable_k_quant_tiles, marker
from tests.support.stand_in_library import needs_cc, stand_in_library

FOLDER = Path(__file__).resolve().parents[2] / "patches" / "llama-cpp-python"


def patch_names() -> set[str]:
    """The patches' names: their file names without the order number and `.patch`."""
    return {re.sub(r"^\d+-", "", path.stem) for path in FOLDER.glob("*.patch")}


def test_the_installed_llama_cpp_carries_every_patch_compiled_in():
    """make venv's AVX2 build on the AVX2 machines CI runs on: every patch's marker says its code is in."""
    assert set(PATCHES) == patch_names()
    assert carried() == dict.fromkeys(PATCHES, True), "rebuild with make venv (CMAKE_ARGS for AVX2)"


def stand_in(folder: Path, source: str) -> Path:
    """The folder of a libggml-cpu.so compiled from `source`."""
    return stand_in_library(folder, "libggml-cpu.so", source).parent


@needs_cc
def test_each_patch_is_read_by_its_own_marker_compiled_in_or_out(tmp_path):
    plain = stand_in(tmp_path / "plain", "int ggml_cpu_has_avx2(void) { return 1; }\n")
    assert carried(plain) == {}
    patched = stand_in(tmp_path / "patched", f"int {marker(PATCHES[0])}(void) {{ return 1; }}\n"
                                             f"int {marker(PATCHES[-1])}(void) {{ return 0; }}\n")
    assert carried(patched) == {PATCHES[0]: True, PATCHES[-1]: False}
    assert carried(tmp_path / "nowhere") == {}


@needs_cc
def test_the_k_quant_tiles_go_off_only_where_the_build_can_turn_them_off(tmp_path):
    plain = stand_in(tmp_path / "plain", "int ggml_cpu_has_avx2(void) { return 1; }\n")
    assert not disable_k_quant_tiles(plain)
    assert not disable_k_quant_tiles(tmp_path / "nowhere")
    patched = stand_in(tmp_path / "patched", f"int off = 0;\nvoid {DISABLE_TILES}(void) {{ off = 1; }}\n")
    assert disable_k_quant_tiles(patched)
    assert ctypes.c_int.in_dll(ctypes.CDLL(str(patched / "libggml-cpu.so")), "off").value == 1


SDIST_CACHE = FOLDER.parents[1] / ".cache" / "llama-cpp-python"


def pinned_sdist() -> tuple[str, str]:
    """The sdist requirements.txt pins, and the sha256 patches/llama-cpp-python/sdist.sha256 pins for it."""
    requirements = (FOLDER.parents[1] / "requirements.txt").read_text()
    version = re.search(r"^llama-cpp-python==([^\s;#]+)", requirements, re.MULTILINE)[1]
    archive = f"llama_cpp_python-{version}.tar.gz"
    hashes = dict(reversed(line.split()) for line in (FOLDER / "sdist.sha256").read_text().splitlines() if line)
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
    applied = subprocess.run([str(FOLDER / "apply.sh"), str(source)], capture_output=True, text=True)
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
    check = FOLDER / "rebase-check.sh"
    ok = subprocess.run([str(check), str(tree)], capture_output=True, text=True)
    names = sorted(p.name for p in FOLDER.glob("*.patch"))
    assert ok.returncode == 0 and ok.stdout.split() == [w for n in names for w in ("applies:", n)], ok.stdout
    rebased = tmp_path / "rebased"
    rebased.mkdir()
    (rebased / names[2]).write_text((FOLDER / names[2]).read_text().replace("nr1 == 1", "nr1 == 0"))
    bad = subprocess.run([str(check), str(tree), str(rebased)], capture_output=True, text=True)
    assert bad.returncode == 1 and f"FAILS:   {names[2]} (rebased)" in bad.stdout, bad.stdout


OFF_AVX2 = ("-mavx", "-mno-avx2", "-mno-fma", "-mf16c")
"""A `-DGGML_AVX2=OFF` build's instruction sets: the patches' guards must leave upstream's code there."""
AVX2 = ("-mavx", "-mavx2", "-mfma", "-mf16c")
"""The Makefile's build (LLAMA_CMAKE_ARGS)."""
PATCHED_FILES = ("ggml-cpu.c", "ops.cpp", "tiled/tiled.cpp", "arch/x86/quants.c", "arch/x86/repack.cpp")


def compile_ggml_cpu(source: Path, file: str, flags: tuple[str, ...], *how: str) -> subprocess.CompletedProcess:
    """ggml-cpu's `file` under `source` run through the compiler `how` (-E, -fsyntax-only), with the
    defines a shared release build of libggml-cpu compiles it with."""
    ggml = Path("vendor") / "llama.cpp" / "ggml"
    compiler = ["cc", "-std=gnu11"] if file.endswith(".c") else ["c++", "-std=c++17"]
    defines = ("-DNDEBUG", "-DGGML_USE_LLAMAFILE=1", "-DGGML_USE_CPU_REPACK", "-DGGML_SHARED", "-DGGML_BACKEND_SHARED",
               "-DGGML_BACKEND_BUILD", "-D_GNU_SOURCE", "-D_XOPEN_SOURCE=600")
    return subprocess.run([*compiler, *how, *defines, *flags, f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
                           f"-I{ggml / 'src' / 'ggml-cpu'}", str(ggml / "src" / "ggml-cpu" / file)],
                          cwd=source, capture_output=True, text=True)


def compiled_code(source: Path, file: str, flags: tuple[str, ...]) -> str:
    """`file` preprocessed (comments, blank lines and the line numbers in ggml_abort's messages dropped):
    the code a compiler sees."""
    run = compile_ggml_cpu(source, file, flags, "-E", "-P")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (re.sub(r'(ggml_abort\("[^"]*", )\d+', r"\1L", line) for line in run.stdout.splitlines())
    return "\n".join(line for line in lines if line.strip())


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="0007 is x86 code")
def test_0007s_tile_is_tied_to_the_q6_k_block_size_in_a_release_build(tmp_path):
    """0007's tile holds one Q6_K super block on the stack; a release build drops its assert(), so a
    static_assert ties the tile to QK_K: a llama.cpp whose block size changed fails to build instead of
    overflowing the tile."""
    source = patched_source(tmp_path)
    built = compile_ggml_cpu(source, "arch/x86/quants.c", AVX2, "-fsyntax-only")
    assert built.returncode == 0, built.stderr[-3000:]
    common = source / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-common.h"
    common.write_text(common.read_text().replace("#define QK_K 256", "#define QK_K 512", 1))
    built = compile_ggml_cpu(source, "arch/x86/quants.c", AVX2, "-fsyntax-only")
    assert built.returncode != 0 and "q6k_tile_block holds a Q6_K super block" in built.stderr, built.stderr[-3000:]


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the guard is tested with x86 flags")
def test_0001s_row_blocks_are_compiled_only_where_they_were_proven(tmp_path):
    """0001's blocks (and its F32 accumulator) are built for AVX2 + F16C + FMA only, where their batch
    invariance was proven; a build without them (`-DGGML_AVX2=OFF`, NEON) runs upstream's loop."""
    source = patched_source(tmp_path)
    proven, other = compiled_code(source, "ops.cpp", AVX2), compiled_code(source, "ops.cpp", OFF_AVX2)
    assert "s_blk[n] = s + mv" in proven and "s_blk[n] = s + mv" not in other
    assert "VKQ32[d] = " not in proven and "VKQ32[d] = " in other, "upstream's F16 accumulator is widened at the end"


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 flags")
def test_every_patched_file_compiles_for_avx2_and_without_it(tmp_path):
    """A marker's declaration, a guard's #else: what only a build would catch, caught in seconds."""
    source = patched_source(tmp_path)
    for file in PATCHED_FILES:
        for flags in (AVX2, OFF_AVX2):
            built = compile_ggml_cpu(source, file, flags, "-fsyntax-only")
            assert built.returncode == 0, f"{file} {flags}: {built.stderr[-3000:]}"


def without_markers(code: str) -> str:
    """`code` without the patches' marker functions (each returns 0 off its guard) and their declarations."""
    code = re.sub(r'(extern "C" \{\n)?(__attribute__ \(\(visibility \("default"\)\)\) )?extern int '
                  r"ggml_cpu_minions_\w+\(void\);\n(\}\n)?", "", code)
    return re.sub(r"int ggml_cpu_minions_\w+\(void\) \{\n    return 0;\n\}\n?", "", code)


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the guards are tested with x86 flags")
def test_off_avx2_the_patched_files_compile_to_upstreams_code_but_for_the_markers(tmp_path):
    """Every patch's kernel or threshold is compiled only where it was proven (AVX2); a build without it
    runs upstream's code, its markers returning 0. What differs, by design: 0001's scalar helper (unused
    there), 0002's column loop counting `nrc` columns, each step upstream's `num_rows_per_vec_dot`, and
    0006's switch (tiled.cpp: off only when a batch-invariant engine, refused there, asks)."""
    pristine, patched = pristine_source(tmp_path / "a"), patched_source(tmp_path / "b")
    for file in (f for f in PATCHED_FILES if f != "tiled/tiled.cpp"):
        upstream, ours = compiled_code(pristine, file, OFF_AVX2), without_markers(compiled_code(patched, file, OFF_AVX2))
        if file == "ops.cpp":
            ours = re.sub(r"\[\[maybe_unused\]\] static void ggml_fa_accumulate_f16\(.*?\n\}\n", "", ours, flags=re.S)
        if file == "ggml-cpu.c":  # names aside (`nrc` is vec_dot's parameter too), upstream's loop
            ours = ours.replace(", nrc = 1;", ";").replace("                nrc = num_rows_per_vec_dot;\n", "")
            ours, upstream = (re.sub(r"\bnrc\b", "num_rows_per_vec_dot", code) for code in (ours, upstream))
        assert ours == upstream, f"{file}: the patches change upstream's code off AVX2"
    tiled = compiled_code(patched, "tiled/tiled.cpp", OFF_AVX2)
    assert "ggml_tiled_matmul_off" in tiled and "GGML_TYPE_Q6_K && dst->src[1]->ne[1] < 256" not in tiled
