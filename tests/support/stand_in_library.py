"""Stand-in shared libraries compiled from a line of C, for tests of code that reads a llama.cpp
library through ctypes (a build's system info, the patches it carries) without building llama.cpp."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in library")


def stand_in_library(folder: Path, name: str, source: str) -> Path:
    """`folder`/`name` (created with `folder`), a shared library compiled from the C `source`."""
    folder.mkdir(parents=True)
    c_file = folder / f"{Path(name).stem}.c"
    c_file.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(c_file)], check=True)
    return folder / name
