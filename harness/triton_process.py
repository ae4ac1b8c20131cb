"""Run the real tritonserver with a deployment on free loopback ports, for benchmarks and tests."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from minions.deploy.config import ROOT, load_deployment
from minions.deploy.server import ServerPorts, free_ports, set_threads, start_server, wait_ready
from minions.triton.shm import SHM_PREFIX, sweep_orphaned_shm

KILLED_STUBS_EXIT_TIMEOUT = ("--exit-timeout-secs=5",)
"""tritonserver's options for a server whose stubs are killed on purpose. Triton 2.51 keeps a killed
stub's instance while requests it never answered are pending, and at the stop waits its exit timeout
(30 s by default) for it, then exits with 1 ("Exit timeout expired", docs/operations.md): 5 s shows
the same and spares a test run 25 s per such server."""


def stop_process(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """Ask a server to stop with `sig`; kill its whole process group if it has not exited in `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Stub:
    """One Python-backend stub process of a server."""

    pid: int
    rss_bytes: int
    shm_region: str
    """The name of its shared-memory region in /dev/shm."""


ENGINE_THREADS_ENV = "MINIONS_ENGINE_THREADS"
"""Where set, every engine of a server started here runs on that many threads instead of its
deployment's (as `make serve --threads`)."""


class TritonProcess:
    """Context manager: start tritonserver, wait until ready, stop it (and its stubs) on exit."""

    running: ClassVar[weakref.WeakSet[TritonProcess]] = weakref.WeakSet()
    """The servers started and not yet stopped (a dead one stays until someone looks: `died`)."""

    def __init__(self, deploy: str | Path = ROOT / "deploy.yaml", log_path: str | Path | None = None,
                 build: str | Path | None = None, edit: Callable[[Path], None] | None = None,
                 triton_args: Sequence[str] = ()) -> None:
        """`edit`: called with the rendered repository before tritonserver starts on it; `triton_args`:
        tritonserver's own options added to its command line (e.g. KILLED_STUBS_EXIT_TIMEOUT)."""
        self.deployment = load_deployment(deploy)
        if threads := os.environ.get(ENGINE_THREADS_ENV):
            set_threads(self.deployment, int(threads))
        self.ports = ServerPorts("127.0.0.1", *free_ports(3))
        self.build = Path(build) if build else Path(tempfile.mkdtemp(prefix="minions-build-"))
        self._own_build = build is None
        """A build folder of its own, in /tmp: its rendered repository goes when the server stops."""
        self.log_path = Path(log_path) if log_path else self.build / "tritonserver.log"
        self.proc: subprocess.Popen | None = None
        self.edit = edit
        self.triton_args = tuple(triton_args)

    @property
    def grpc_url(self) -> str:
        return f"{self.ports.host}:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.metrics}/metrics"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "TritonProcess":
        self._log = open(self.log_path, "w")
        self.proc = start_server(self.deployment, self.ports, self.build, stdout=self._log, edit=self.edit,
                                 triton_args=self.triton_args)
        try:
            wait_ready(self.ports, self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"tritonserver did not start; log tail:\n{self.log_text()[-4000:]}") from None
        TritonProcess.running.add(self)
        return self

    @classmethod
    def died(cls) -> list[str]:
        """How each server that exited without being stopped ended (its exit code, the room left in
        /dev/shm, where a full tmpfs kills whoever touches a new page of a region, and its log tail);
        they are then forgotten, so each is told once."""
        dead = [server for server in cls.running if server.proc.poll() is not None]
        if not dead:  # the usual answer, asked after every integration test
            return []
        for server in dead:
            cls.running.discard(server)
        shm = os.statvfs("/dev/shm")
        room = f"/dev/shm {shm.f_bavail * shm.f_frsize >> 20} of {shm.f_blocks * shm.f_frsize >> 20} MiB free"
        return [f"tritonserver of {server.build} exited with code {server.proc.returncode} while in use ({room}); "
                f"log tail:\n{server.log_text()[-4000:]}" for server in dead]

    def stub_commands(self) -> list[tuple[int, int, list[str]]]:
        """(pid, RSS in bytes, command line words) of each of this server's stub processes, from ps
        (both of a model while it reloads)."""
        out = subprocess.run(["ps", "-ww", "-eo", "pid,rss,args"], capture_output=True, text=True, check=True).stdout
        found = []
        for line in out.splitlines():
            if "triton_python_backend_stub" in line and f"{self.build}/" in line:
                pid, rss, *args = line.split()
                found.append((int(pid), int(rss) * 1024, args))
        return found

    def instance_stubs(self) -> list[tuple[str, Stub]]:
        """This server's stub processes, each with its model instance's name (e.g. `llm_0_0`): two share
        a name while a reloaded model's old instance is still being unloaded."""
        found = []
        for pid, rss, args in self.stub_commands():
            instance = next((a for a in reversed(args) if re.search(r"_\d+_\d+$", a)), args[-1])
            region = next((a for a in args if SHM_PREFIX in a), "")
            found.append((instance, Stub(pid, rss, region.lstrip("/"))))
        return found

    def stubs(self) -> dict[str, Stub]:
        """This server's stub processes, by model instance name; one of the two while a model reloads
        (`instance_stubs` has both)."""
        return dict(self.instance_stubs())

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        TritonProcess.running.discard(self)
        stop_process(self.proc, signal.SIGINT, timeout)
        self._kill_stubs()  # a server that died (or was killed) leaves its stubs running
        sweep_orphaned_shm(min_age_s=0.0)  # this server's killed stubs left theirs; no process maps them now
        self._log.close()
        if self._own_build:  # the log stays (it is read after the stop), what was rendered goes
            for part in self.build.iterdir():
                if part.is_dir():
                    shutil.rmtree(part)
                elif part != self.log_path:
                    part.unlink()
        return self.proc.returncode

    def _kill_stubs(self) -> None:
        """End this server's stubs still running, and wait until they are gone (then nothing maps their
        shared memory)."""
        pids = [stub.pid for stub in self.stubs().values()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        self.stop()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead server's stubs are reparented, maybe to a parent that never reaps)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
