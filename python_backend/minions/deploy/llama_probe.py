"""Whether this machine's llama.cpp build runs a GGUF: asked once per file and build, in a child process.

`make venv` builds llama.cpp for the machine it runs on. A virtual CPU can advertise instructions it
does not run (AVX-512, AMX), and every quantised GGUF then kills its process with SIGILL at its first
decode. Triton reports that only as `Stub process ... is not healthy` once the engine model fails to
load. Decoding one token in a child process before tritonserver starts finds it out, and serving stops
with one line saying what to do (docs/operations.md, "`Illegal instruction` on a quantised GGUF").
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

PROBE = ("import sys, llama_cpp; m = llama_cpp.Llama(sys.argv[1], n_ctx=128, n_threads=1, verbose=False); "
         "m.eval(list(range(10, 74))); m.eval([10])")
"""Load the file, prefill a 64-token batch and decode one token: the quantised batch kernels are where
the unsupported instructions ran (a 2-token prompt passed on the machine where this was met)."""
REBUILD = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
           "patches/llama-cpp-python/install.sh .venv/bin/python")
"""The rebuild for AVX2 that ran every file on the machine where this was met (with the project's patches)."""


class LlamaBuildError(RuntimeError):
    """The installed llama.cpp cannot run a deployment's GGUF on this machine."""


LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"
"""llama-cpp-python loads its shared libraries from this folder where it is set (another build of
llama.cpp), else from its package's `lib`."""


def build_id() -> str:
    """The llama.cpp build that llama_cpp loads, as the files of its shared libraries (path, size,
    mtime); found without importing llama_cpp, which would load them into the process that starts
    the server."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise LlamaBuildError("llama-cpp-python is not installed in this environment (make venv)")
    override = os.environ.get(LIB_PATH_ENV)
    libs = sorted((Path(override) if override else Path(spec.origin).parent / "lib").glob("*.so*"))
    stats = [f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in libs if p.is_file()]
    return hashlib.sha256("\n".join(stats).encode()).hexdigest()[:16]


def check_runs(gguf: Path, cache_dir: Path, probe: str = PROBE, timeout_s: float = 600.0) -> None:
    """Raise LlamaBuildError unless llama.cpp, as installed, loads `gguf` and decodes with it. A pass is
    remembered under `cache_dir` for this file and build; `probe` is the child's Python code (argv[1]:
    the file)."""
    stamp = cache_dir / "llama-probe" / f"{gguf.name}.{build_id()}.ok"
    if stamp.exists():
        return
    try:
        done = subprocess.run([sys.executable, "-c", probe, str(gguf)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise LlamaBuildError(f"llama.cpp did not load and decode {gguf} within {timeout_s:.0f} s") from None
    if done.returncode == -signal.SIGILL:
        raise LlamaBuildError(
            f"llama.cpp as built cannot run {gguf.name} on this CPU (Illegal instruction at its first decode); "
            f"rebuild it without native instructions: {REBUILD}")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise LlamaBuildError(f"llama.cpp could not load and decode {gguf}: {tail}")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
