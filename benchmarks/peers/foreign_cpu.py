"""How much CPU other processes took while a cell ran: a cell's numbers mean little if they did.

On a small shared machine one busy process is enough to wreck llama.cpp (its threads spin at
barriers, and with as many threads as cores each descheduled thread stalls every step: 2 s a token
was seen). The machine's busy time (/proc/stat) less that of the benchmark's own sessions (this
process's and each server's: they start their own) gives the cores others used, on average.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _machine_busy_ticks() -> int:
    """Busy clock ticks of all CPUs since boot (user, nice, system, irq, softirq, steal)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4]  # less idle and iowait


def _session_ticks(sessions: set[int]) -> int:
    """CPU clock ticks (user + system) used so far by live processes of these sessions."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[3]) in sessions:
            total += int(fields[11]) + int(fields[12])
    return total


class ForeignCpu:
    """Context manager: `cores` = mean CPU cores used by processes outside `sessions` during the block."""

    def __init__(self, sessions: set[int]) -> None:
        self.sessions = sessions | {os.getsid(0)}
        self.cores: float | None = None

    def __enter__(self) -> ForeignCpu:
        self._start = (time.perf_counter(), _machine_busy_ticks(), _session_ticks(self.sessions))
        return self

    def __exit__(self, *exc) -> None:
        t0, busy0, ours0 = self._start
        wall = time.perf_counter() - t0
        foreign = (_machine_busy_ticks() - busy0) - (_session_ticks(self.sessions) - ours0)
        self.cores = max(foreign, 0) / os.sysconf("SC_CLK_TCK") / wall if wall > 0 else None
