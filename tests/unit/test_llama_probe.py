"""minions.deploy.llama_probe: a GGUF that llama.cpp, as built, cannot run on this machine stops serving
with one line before tritonserver starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from minions.deploy.llama_probe import LlamaBuildError, build_id, check_runs


def test_a_file_that_runs_passes_once_and_is_remembered(tmp_path, smollm2_f16_gguf):
    gguf = Path(smollm2_f16_gguf)
    check_runs(gguf, tmp_path)
    assert (tmp_path / "llama-probe" / f"{gguf.name}.{build_id()}.ok").exists()
    check_runs(gguf, tmp_path, probe="raise SystemExit(3)")  # remembered: a failing probe is not run again


def test_a_build_loaded_from_llama_cpp_lib_path_is_probed_as_a_build_of_its_own(tmp_path, monkeypatch):
    """llama-cpp-python loads the libraries under LLAMA_CPP_LIB_PATH where it is set: a pass remembered
    for the installed build must not stand for them."""
    installed = build_id()
    other = tmp_path / "lib"
    other.mkdir()
    (other / "libllama.so").write_bytes(b"another build")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(other))
    there = build_id()
    assert there != installed
    (other / "libllama.so").write_bytes(b"rebuilt there, larger")
    assert build_id() not in (installed, there), "a rebuild in that folder is a build of its own too"


def test_a_probe_killed_by_an_illegal_instruction_says_to_rebuild(tmp_path, smollm2_f16_gguf):
    """The child really dies by SIGILL, as a native build's first decode did on a CPU that advertises
    what it does not run (docs/operations.md)."""
    sigill = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    with pytest.raises(LlamaBuildError, match="Illegal instruction.*CMAKE_ARGS=.*GGML_NATIVE=OFF"):
        check_runs(Path(smollm2_f16_gguf), tmp_path, probe=sigill)
    assert not (tmp_path / "llama-probe").exists(), "a failure is not remembered"


def test_a_file_llama_cpp_cannot_load_is_named_with_its_error(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    with pytest.raises(LlamaBuildError, match="could not load and decode .*broken.gguf"):
        check_runs(broken, tmp_path)
