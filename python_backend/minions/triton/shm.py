"""Python-backend shared-memory regions left in /dev/shm by stubs that died: found and removed.

A stub that was killed or crashed cannot free its region, and tritonserver does not; the server
launcher sweeps before it starts, the orchestrator after it reloads a dead SSM. Pure Python (no
pb_utils), so the launcher and the tests may import it outside a stub.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

log = logging.getLogger("minions.shm")

SHM_PREFIX = "triton_python_backend_shm_region_"


def mapped_shm_regions() -> set[str]:
    """Python-backend shared-memory regions some process maps (read from /proc/*/maps)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(re.findall(rf"/dev/shm/({SHM_PREFIX}\S+)", maps.read_text()))
        except OSError:  # the process has gone
            continue
    return mapped


def sweep_orphaned_shm(min_age_s: float = 2.0) -> list[str]:
    """Remove Python-backend shared-memory regions that no process maps any more, and return their
    names: a stub that was killed or crashed cannot free its region, and tritonserver does not. A
    region younger than `min_age_s` is left alone (a server may be creating it)."""
    mapped = mapped_shm_regions()
    removed = []
    for region in Path("/dev/shm").glob(SHM_PREFIX + "*"):
        try:
            if region.name not in mapped and time.time() - region.stat().st_mtime >= min_age_s:
                region.unlink()
                removed.append(region.name)
        except OSError:
            continue
    if removed:
        log.info("removed %d orphaned shared-memory region(s) from /dev/shm: %s", len(removed), ", ".join(removed))
    return removed
