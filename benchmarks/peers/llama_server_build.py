"""llama.cpp's own `llama-server`, built once from the sources vendored in the llama-cpp-python sdist
pinned in requirements.txt, so that the peer runs exactly the llama.cpp the Minions engines link.

The build (about 6 minutes on 2 cores) is cached under .cache/peers/ (git-ignored); later runs reuse it.
`python -m benchmarks.peers.llama_server_build` builds it ahead of a benchmark. `CMAKE_ARGS`, as
llama-cpp-python's own build reads it, is passed on after the defaults: a machine whose native build
dies of `Illegal instruction` builds both the same way (docs/operations.md), each set of flags in a
build folder of its own. The peer is refused unless it was compiled for the same CPU features as the
engines' llama.cpp (`same_build`): a native llama-server against `make venv`'s AVX2 build measures the
builds, not the servers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from minions.deploy.config import ROOT

log = logging.getLogger(__name__)

CACHE = ROOT / ".cache" / "peers"
SDIST_DIR = ROOT / ".cache" / "llama-cpp-python"
"""Where patches/llama-cpp-python/install.sh keeps the sdist `make venv` builds from: one download for both."""
PACKAGE = "llama-cpp-python"
TARGETS = ("llama-server", "llama-bench")
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release")


def pinned_version(requirements: Path = ROOT / "requirements.txt") -> str:
    """The llama-cpp-python version requirements.txt pins (the one place it is written)."""
    match = re.search(rf"^{re.escape(PACKAGE)}==([^\s;#]+)", requirements.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{requirements} pins no {PACKAGE}==<version>")
    return match.group(1)


def source_dir(version: str) -> Path:
    """llama.cpp's sources from the sdist, downloaded and unpacked once."""
    root = CACHE / f"llama_cpp_python-{version}"
    llama_cpp = root / "vendor" / "llama.cpp"
    if (llama_cpp / "CMakeLists.txt").exists():
        return llama_cpp
    archive = SDIST_DIR / f"llama_cpp_python-{version}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"{PACKAGE}=={version}", "-d", str(SDIST_DIR)], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE)  # our own pinned sdist from the package index
    if not (llama_cpp / "CMakeLists.txt").exists():
        raise FileNotFoundError(f"{archive} holds no vendor/llama.cpp")
    return llama_cpp


def cmake_flags(cmake_args: str = "") -> tuple[list[str], str]:
    """The configure flags (the defaults, then `cmake_args`, whose later -D wins) and the name of
    their build folder: `build` for the defaults alone."""
    extra = shlex.split(cmake_args)
    folder = f"build-{hashlib.sha256(' '.join(extra).encode()).hexdigest()[:8]}" if extra else "build"
    return [*CMAKE_FLAGS, *extra], folder


def llama_server(version: str | None = None, jobs: int = 2) -> Path:
    """The path of the built llama-server binary (building it and llama-bench on first use), once it is
    known to be built as the engines' llama.cpp is (`same_build`)."""
    version = version or pinned_version()
    src = source_dir(version)
    flags, build = cmake_flags(os.environ.get("CMAKE_ARGS", ""))
    binary = src / build / "bin" / "llama-server"
    if not binary.exists():
        if shutil.which("cmake") is None:
            raise FileNotFoundError("cmake is needed to build llama-server (apt-get install cmake)")
        log.info("building llama-server %s in %s with %s (once, minutes)", version, src / build, " ".join(flags))
        subprocess.run(["cmake", "-B", build, *flags], cwd=src, check=True)
        subprocess.run(["cmake", "--build", build, f"-j{jobs}", "--target", *TARGETS], cwd=src, check=True)
    same_build(binary)
    return binary


def features(system_info: str) -> set[str]:
    """What llama.cpp's system info (`CPU : SSE3 = 1 | AVX2 = 1 | ...`) says a build uses: the
    instruction sets its kernels were compiled for, and LLAMAFILE, OPENMP, REPACK."""
    return {name for name, value in re.findall(r"(\w+) = (\w+)", system_info) if value == "1"}


def build_features(binary: Path) -> set[str]:
    """`features` of the llama.cpp build that `binary` (llama-server) links, read from its libllama in
    a process of its own (two llama.cpp libraries do not share one)."""
    probe = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
             "lib.llama_print_system_info.restype = ctypes.c_char_p; print(lib.llama_print_system_info().decode())")
    out = subprocess.run([sys.executable, "-c", probe, str(binary.parent / "libllama.so")], check=True,
                         capture_output=True, text=True).stdout
    return features(out)


def same_build(binary: Path) -> None:
    """Raise unless llama-server at `binary` was compiled for the CPU features the engines' llama.cpp
    (llama-cpp-python, as `make venv` built it) was."""
    import llama_cpp

    ours, peer = features(llama_cpp.llama_print_system_info().decode()), build_features(binary)
    if ours != peer:
        raise RuntimeError(
            f"{binary} was built for other CPU features than the engines' llama.cpp (only the peer: "
            f"{', '.join(sorted(peer - ours)) or '-'}; only the engines: {', '.join(sorted(ours - peer)) or '-'}): "
            "the comparison would measure the builds. Set CMAKE_ARGS to the flags llama-cpp-python was built "
            "with (`make bench-peers` passes the Makefile's LLAMA_CMAKE_ARGS, as `make venv` does).")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(llama_server())
