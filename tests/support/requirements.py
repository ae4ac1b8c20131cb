"""Reading pinned requirement files, for the tests that check one file's pins against requirements.txt."""

from __future__ import annotations

import re
from pathlib import Path


def pins(path: Path) -> dict[str, str | None]:
    """Each requirement line's package (extras dropped, lower case) -> its `==` version (None: not pinned so)."""
    out = {}
    for line in path.read_text().splitlines():
        req = line.split("#", 1)[0].strip()
        if req:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*(?:==\s*(\S+)|.*)", req)
            out[m[1].lower()] = m[2]
    return out
