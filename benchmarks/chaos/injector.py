"""A chaos run's faults, injected one at a time: each once the previous one has settled, its model's
recovery and the first request served after it recorded."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.stub_kill import kill_outside_locks
from harness.triton_process import TritonProcess
from minions.triton.model_control import mark_modified

from .load import Load
from .processes import LogWatch, stub_processes
from .schedule import Fault
from .verdict import SERVED

SETTLE_S = 10.0
"""After a fault's recovery, how long memory samples still count as unsettled: a reloaded model's old
instance is unloaded once its last calls are answered (the orchestrator's streams retire after 10 s)."""


@dataclass
class FaultRecord:
    kind: str
    model: str
    t: float
    """Seconds into the run when it was injected."""
    pid: int | None = None
    """The stub killed, or the stub a reload replaced."""
    region: str = ""
    """That stub's shared-memory region."""
    recovered_s: float | None = None
    """Injection to a new stub of the model running and loaded (a reload: the load call's time)."""
    served_again_s: float | None = None
    """Injection to the end of the first request sent after it that was served."""
    error: str | None = None
    restored: str | None = None
    """What the chaos tool did itself when the model had not recovered by the deadline."""
    requests: dict = field(default_factory=dict)
    """How the requests that ended between the injection and the recovery (or the deadline) ended."""


class Injector(threading.Thread):
    """Injects the schedule's faults one at a time: each once the previous one has settled (its model
    recovered and a request sent after it served) and its gap has passed."""

    def __init__(self, server: TritonProcess, load: Load, schedule: Iterator[Fault],
                 recovery_s: float, served_s: float, t0: float, seed: int) -> None:
        super().__init__(daemon=True, name="chaos-injector")
        self.server, self.traffic, self.schedule, self.t0 = server, load, schedule, t0
        self.recovery_s, self.served_s = recovery_s, served_s
        self.rng = random.Random(seed)
        self.log = LogWatch(server.log_path)
        self.records: list[FaultRecord] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.unsettled_until = 0.0
        """A fault is under way, or settled less than SETTLE_S ago, until this (monotonic) time."""

    def settled(self) -> bool:
        return time.monotonic() >= self.unsettled_until

    def run(self) -> None:
        try:
            for fault in self.schedule:
                if self.stopping.wait(fault.gap_s) or not self.live():
                    return
                print(f"[{self.now():6.1f} s] {fault.kind} {fault.model}", flush=True)
                self.unsettled_until = float("inf")
                injected = time.monotonic()
                record = self.inject(fault)
                self.unsettled_until = time.monotonic() + SETTLE_S
                self.records.append(record)
                print(f"[{self.now():6.1f} s] {fault.kind} {fault.model}: " + (
                    f"error: {record.error}" if record.error else
                    f"recovered in {record.recovered_s:.1f} s" if record.recovered_s is not None else
                    f"NOT recovered in {self.recovery_s:g} s; {record.restored}"), flush=True)
                record.served_again_s = self.wait_served(injected, time.monotonic() + self.served_s)
                print(f"[{self.now():6.1f} s] {fault.kind} {fault.model}: " + (
                    f"a request sent after it was served {record.served_again_s:.1f} s after it"
                    if record.served_again_s is not None else f"NO request served in {self.served_s:g} s"),
                    flush=True)
        except BaseException as exc:  # reported as a problem by the run
            self.error = exc

    def live(self) -> bool:
        return not self.stopping.is_set() and self.server.proc.poll() is None

    def now(self) -> float:
        return time.monotonic() - self.t0

    def inject(self, fault: Fault) -> FaultRecord:
        before = [s for s in stub_processes(self.server) if s.model == fault.model]
        loads = self.log.loads(fault.model)
        record = FaultRecord(fault.kind, fault.model, round(self.now(), 1))
        if not before:
            record.error = "no stub of the model runs (not recovered from an earlier fault?)"
            return record
        victim = self.rng.choice(sorted(before, key=lambda s: s.pid))
        record.pid, record.region = victim.pid, victim.region
        start = time.monotonic()
        if fault.kind == "reload":
            try:
                self.load(fault.model)
            except Exception as exc:  # a failed reload is a problem of the run
                record.error = f"load_model failed: {exc}"
                return record
        else:
            with contextlib.suppress(ProcessLookupError):
                kill_outside_locks(victim.pid)
        old = {s.pid for s in before}
        if self.wait_recovered(fault.model, old, loads, start + self.recovery_s):
            record.recovered_s = round(time.monotonic() - start, 2)
        elif self.server.proc.poll() is None:
            try:
                loads = self.log.loads(fault.model)
                self.load(fault.model)
                ok = self.wait_recovered(fault.model, old, loads, time.monotonic() + 60)
                record.restored = "loaded the model again" if ok else "loaded the model again, still no stub"
            except Exception as exc:
                record.restored = f"load_model failed: {exc}"
        return record

    def wait_served(self, after: float, deadline: float) -> float | None:
        """Seconds from `after` (monotonic) to the end of the first served request sent after it; None if
        none is by the deadline (or the server has exited)."""
        since = after - self.t0
        while time.monotonic() < deadline and self.server.proc.poll() is None:
            with self.traffic.lock:
                ends = [r.end for r in self.traffic.results if r.outcome == SERVED and r.start >= since]
            if ends:
                return round(min(ends) - since, 2)
            time.sleep(0.25)
        return None

    def wait_recovered(self, model: str, old_pids: set[int], loads: int, deadline: float) -> bool:
        """Until a stub of `model` that is not one of `old_pids` runs and Triton has logged the model loaded
        more than `loads` times; False at the deadline (or when the server has exited)."""
        while time.monotonic() < deadline and self.server.proc.poll() is None:
            if self.log.loads(model) > loads and any(s.model == model and s.pid not in old_pids
                                                     for s in stub_processes(self.server)):
                return True
            time.sleep(0.25)
        return False

    def load(self, model: str) -> None:
        """Load the model again through the repository API, as an operator after an edit: Triton loads a
        model only if its files changed (minions/triton/model_control.py), so they are touched first."""
        import tritonclient.grpc as grpcclient

        mark_modified(self.server.build / "model_repository", model)
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            client.load_model(model, client_timeout=self.recovery_s)
        finally:
            client.close()
