"""A batch-invariant llama.cpp engine claims exactness only on a CPU the patches were proven on and with
the patches it relies on (engines/llamacpp_patches.py `invariance_refusal`); elsewhere it refuses to
load with the reason. The engine on this machine: tests/unit/test_llamacpp_batch_invariance.py."""

from __future__ import annotations

from minions.engines.llamacpp_patches import (K_QUANT_BATCH_INVARIANT, build_flags, carried, cpu_flags,
                                              invariance_refusal)
from tests.support.stand_in_library import needs_cc, stand_in_library

AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c"}
PATCHED = {K_QUANT_BATCH_INVARIANT: True}


def test_an_avx2_x86_cpu_with_the_patches_may_claim_it():
    assert invariance_refusal(PATCHED, "x86_64", AVX2) is None


def test_other_cpus_are_refused_with_what_they_lack():
    assert "aarch64" in invariance_refusal(PATCHED, "aarch64", {"asimd", "i8mm"})
    refusal = invariance_refusal(PATCHED, "x86_64", {"avx", "sse4_2"})
    assert "missing: avx2, f16c, fma" in refusal


def test_a_build_without_the_k_quant_patch_or_with_it_compiled_out_is_refused():
    assert K_QUANT_BATCH_INVARIANT in invariance_refusal({}, "x86_64", AVX2)
    assert K_QUANT_BATCH_INVARIANT in invariance_refusal({K_QUANT_BATCH_INVARIANT: False}, "x86_64", AVX2)


def test_cpu_flags_read_x86_and_arm_cpuinfo(tmp_path):
    x86, arm, none = tmp_path / "x86", tmp_path / "arm", tmp_path / "none"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma f16c\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd i8mm\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "fma", "f16c"}
    assert cpu_flags(arm) == {"fp", "asimd", "i8mm"}
    assert cpu_flags(none) == frozenset()


def test_this_machine_and_build_pass_the_guard():
    """make venv's AVX2 build on the AVX2 machines CI runs on: the default deployment's engines load."""
    assert build_flags() == {"avx2", "fma", "f16c"}
    assert invariance_refusal(carried(), built=build_flags()) is None


@needs_cc
def test_a_build_compiled_without_avx2_is_refused_on_an_avx2_cpu(tmp_path):
    """A guards-off build (-DGGML_AVX2=OFF) on a CPU that has AVX2: its patched kernels are compiled out."""
    source = "".join(f"int ggml_cpu_has_{flag}(void) {{ return {int(flag != 'avx2')}; }}\n"
                     for flag in ("avx2", "fma", "f16c"))
    lib_dir = stand_in_library(tmp_path / "no-avx2", "libggml-cpu.so", source).parent
    built = build_flags(lib_dir)
    assert built == {"fma", "f16c"}
    assert "compiled without avx2" in invariance_refusal(PATCHED, "x86_64", AVX2, built)
    assert build_flags(tmp_path / "nowhere") is None
