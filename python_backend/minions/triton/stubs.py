"""The Python-backend stub processes of a model, found by their command lines: Triton 2.51 neither
restarts a dead stub nor marks its model not ready, so whether a stub lives is read from /proc (the
orchestrator's models and tritonserver share the host)."""

from __future__ import annotations

import os
import time
from pathlib import Path

STUB = b"triton_python_backend_stub"
"""The stub executable's name, the first word of each stub's command line."""


def _stat_fields(process: Path) -> list[str]:
    """The fields of a process's /proc stat from the third (its state) on: those after its name, which
    may hold spaces and parentheses itself."""
    return (process / "stat").read_text().rsplit(")", 1)[1].split()


def live_stubs(repository: Path, proc: Path = Path("/proc")) -> dict[str, list[int]]:
    """The live stub processes (zombies excluded) of each model of `repository` that has one, by model
    name: one pass over /proc, which the orchestrator makes every poll while tokens stream (so the
    command line is read first, and a process's state only when it is a stub)."""
    prefix = f"{repository}/".encode()
    stubs: dict[str, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if not args[0].endswith(STUB):
                continue
            model_file = next((a for a in args[1:] if a.startswith(prefix)), None)
            if model_file is None or _stat_fields(entry)[0] == "Z":
                continue
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        model = model_file[len(prefix):].split(b"/", 1)[0].decode()
        stubs.setdefault(model, []).append(int(entry.name))
    return stubs


def live_stub_pids(model_dir: Path, proc: Path = Path("/proc")) -> list[int]:
    """Python-backend stub processes serving the model in `model_dir`, zombies excluded."""
    return live_stubs(model_dir.parent, proc).get(model_dir.name, [])


def boot_clock() -> float:
    """Seconds since boot: the clock of a process's start time in /proc (`stub_start_times`)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def process_start_time(pid: int, proc: Path = Path("/proc")) -> float | None:
    """When process `pid` started, on `boot_clock` (to the kernel's clock tick); None once it is gone."""
    try:
        fields = _stat_fields(proc / str(pid))
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat, counted from field 3


def stub_start_times(model_dir: Path, proc: Path = Path("/proc")) -> dict[int, float]:
    """The live stubs of the model in `model_dir`, each with its start time (`process_start_time`); a
    stub that exits between the two reads is left out."""
    starts = {pid: process_start_time(pid, proc) for pid in live_stub_pids(model_dir, proc)}
    return {pid: start for pid, start in starts.items() if start is not None}
