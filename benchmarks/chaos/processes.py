"""The server's processes as a chaos run watches them: its stubs (model, pid, RSS, shared-memory region),
tritonserver's log, the memory sampler, and `make serve`'s watchdog run beside it."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.triton_process import TritonProcess
from minions.deploy.watchdog import WATCH_INTERVAL_S, StubWatchdog
from minions.triton.shm import SHM_PREFIX

# -- the server's processes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StubProcess:
    model: str
    pid: int
    rss_bytes: int
    region: str


def stub_processes(server: TritonProcess) -> list[StubProcess]:
    """Every live stub of the server (two of a model while it reloads), by model."""
    stubs = []
    for pid, rss, args in server.stub_commands():
        model = next((Path(a).parent.parent.name for a in args if a.endswith("/model.py")), "?")
        region = next((a.lstrip("/") for a in args if SHM_PREFIX in a), "")
        stubs.append(StubProcess(model, pid, rss, region))
    return stubs


def process_rss(pid: int) -> int:
    try:
        return int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        return 0


class LogWatch:
    """tritonserver's log, read as it grows: how often a model was loaded, crash lines."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.text = path, 0, ""
        self.lock = threading.Lock()

    def read(self) -> str:
        with self.lock:
            if self.path.exists():
                with self.path.open("rb") as f:
                    f.seek(self.offset)
                    data = f.read()
                self.offset += len(data)
                self.text += data.decode(errors="replace")
            return self.text

    def loads(self, model: str) -> int:
        return self.read().count(f"successfully loaded '{model}'")


class Sampler(threading.Thread):
    """Every `every` s: the RSS of tritonserver and of its stubs, and the stubs' shared-memory regions."""

    def __init__(self, server: TritonProcess, every: float, t0: float, settled: Callable[[], bool]) -> None:
        super().__init__(daemon=True, name="chaos-sampler")
        self.server, self.every, self.t0, self.settled = server, every, t0, settled
        self.samples: list[dict] = []
        self.regions: set[str] = set()
        self.done = threading.Event()

    def sample(self) -> dict:
        stubs = stub_processes(self.server)
        self.regions |= {s.region for s in stubs if s.region}
        by_model: Counter = Counter()
        for s in stubs:
            by_model[s.model] += s.rss_bytes
        by_model["tritonserver"] = process_rss(self.server.proc.pid)
        s = {"t": round(time.monotonic() - self.t0, 1), "total": sum(by_model.values()), "settled": self.settled(),
             "rss": dict(by_model)}
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self.done.wait(self.every):
            if self.server.proc.poll() is None:
                self.sample()


class Watchdog(threading.Thread):
    """`make serve`'s watchdog of the orchestrator's stub (deploy/watchdog.py), run as `make serve` runs it
    beside tritonserver: a look every WATCH_INTERVAL_S s, loading the model again when its stub died."""

    def __init__(self, server: TritonProcess) -> None:
        super().__init__(daemon=True, name="chaos-watchdog")
        self.watchdog = StubWatchdog(server.build / "model_repository", server.deployment.orchestrator_name,
                                     server.grpc_url)
        self.done = threading.Event()
        self.reloads = 0

    def run(self) -> None:
        while not self.done.wait(WATCH_INTERVAL_S):
            try:
                self.reloads += self.watchdog.check()
            except Exception:  # tritonserver is busy loading or stopping: the next look tries again
                continue
