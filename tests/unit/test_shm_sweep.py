"""minions.deploy.server.sweep_orphaned_shm: a region no process maps is removed; a mapped one stays."""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path

from minions.triton.shm import SHM_PREFIX, sweep_orphaned_shm


def _region(size: int = 4096) -> Path:
    path = Path("/dev/shm") / f"{SHM_PREFIX}test-{uuid.uuid4()}"
    path.write_bytes(b"\0" * size)
    return path


def test_only_unmapped_regions_are_removed():
    orphan, live = _region(), _region()
    fd = os.open(live, os.O_RDWR)
    mapping = mmap.mmap(fd, 4096)
    try:
        removed = sweep_orphaned_shm(min_age_s=0.0)
        assert orphan.name in removed and not orphan.exists()
        assert live.name not in removed and live.exists()
    finally:
        mapping.close()
        os.close(fd)
        live.unlink(missing_ok=True)
        orphan.unlink(missing_ok=True)


def test_a_region_younger_than_the_margin_is_left_alone():
    young = _region()
    try:
        assert young.name not in sweep_orphaned_shm(min_age_s=60.0) and young.exists()
    finally:
        young.unlink(missing_ok=True)
