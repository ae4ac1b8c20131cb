"""Small helpers for the integration tests: serving a deployment, raw tritonclient calls where the
client library would hide what is under test, metrics, near ties."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from minions.settings import EngineSettings
from harness.metrics import metric_samples, metric_value  # noqa: F401 (the tests import them from here)
from harness.prompts import kept_prompts  # noqa: F401
from harness.stub_kill import kill_outside_locks
from harness.triton_process import KILLED_STUBS_EXIT_TIMEOUT, Stub, TritonProcess


class StubKill(threading.Thread):
    """SIGKILL a stub from a thread of its own (started; join it), at a moment it holds no shared-memory
    lock (harness/stub_kill.py): killed inside one, it leaves tritonserver 2.51 to abort itself
    with `boost::interprocess::lock_exception` (docs/operations.md), a fault of Triton's Python backend
    and not what the tests that kill stubs are about. Seen in fresh-clone CI killing the LLM's stub
    as a chunk arrived, the idle orchestrator's just after its last response and, killed 50 ms after a
    chunk, an SSM's, which hands a draft over every round."""

    def __init__(self, pid: int) -> None:
        super().__init__(name=f"kill-{pid}", daemon=True)
        self.pid = pid
        self.killed_at: float | None = None
        """time.monotonic() once killed."""
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            kill_outside_locks(self.pid)
        except BaseException as exc:  # raised again by join(), on the test's thread
            self.error = exc
            return
        self.killed_at = time.monotonic()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the kill; raises what stopped it (the stub gone, or always found inside a lock)."""
        super().join(timeout)
        if self.error is not None:
            raise self.error


class KillAfterChunk:
    """A stream's `on_text` callback that notes each chunk's arrival and, after the `n`-th, kills `pid`
    (`StubKill`)."""

    def __init__(self, pid: int, n: int) -> None:
        self.pid, self.n = pid, n
        self.arrivals: list[float] = []
        self.kill: StubKill | None = None

    def __call__(self, chunk: str) -> None:
        self.arrivals.append(time.monotonic())
        if len(self.arrivals) == self.n:
            self.kill = StubKill(self.pid)

    def join(self) -> StubKill:
        """The kill, once done; fails if the stream ended before its `n`-th chunk."""
        assert self.kill is not None, f"the stream ended after {len(self.arrivals)} chunks, before the kill"
        self.kill.join()
        return self.kill


COPY_PROMPT = ("Repeat this list exactly, once: Apple, Banana, Cherry, Date, Elderberry, Fig, Grape, Honeydew, Kiwi, "
               "Lemon, Mango, Nectarine, Orange, Papaya")
"""Copy-heavy: as a chat, SmolLM2 (its Q4_1 GGUF, and the torch deployment's weights) answers with the
list word for word, so prompt lookup and suffix matching draft from its first words on and the LLM
accepts. (It rewrites code it is asked to copy: `def add` became `def add_subtract`. The same list in
lower case was copied until flash attention's accumulator went from F16 to F32 (patches/llama-cpp-python):
then the first token tipped to "Apple" and the rest went its own way. Capitalised, it is copied on both.)"""


def http_post(url: str, body: dict | str, timeout: float = 120.0) -> tuple[int, str]:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def http_request(url: str, data: bytes | Iterable[bytes] | None = None, method: str = "POST",
                 headers: Mapping[str, str] | None = None, timeout: float = 120.0) -> tuple[int, dict[str, str], str]:
    """One raw HTTP request (no client library between the test and the server): status, headers, body.
    An iterable `data` goes in chunks (Transfer-Encoding: chunked, no Content-Length)."""
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def http_ok(url: str) -> bool:
    """Whether a GET of `url` answers 200 (False while nothing listens)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def grpc_tensor(name: str, array: np.ndarray, triton_type: str):
    t = grpcclient.InferInput(name, list(array.shape), triton_type)
    t.set_data_from_numpy(array)
    return t


def grpc_tensors(arrays: dict[str, np.ndarray]) -> list:
    """gRPC input tensors of numpy arrays by name, each typed from its array (object arrays as BYTES)."""
    return [grpc_tensor(name, array, "BYTES" if array.dtype == object else grpcclient.np_to_triton_dtype(array.dtype))
            for name, array in arrays.items()]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll `predicate` until it holds; the seconds waited, or an AssertionError saying `what` did not
    happen within `timeout` s."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"{what} not met within {timeout} s"
        time.sleep(interval)
    return time.monotonic() - start


def sole_stub(server: TritonProcess, instance: str, timeout: float = 60.0) -> Stub:
    """The stub of model instance `instance` once it is the only one: after a reload, the old instance's
    stub lives on until Triton has unloaded it (which the orchestrator's next model poll lets it do)."""
    def stubs() -> list[Stub]:
        return [stub for name, stub in server.instance_stubs() if name == instance]

    wait_until(lambda: len(stubs()) == 1, timeout, f"a single live stub of {instance}", interval=0.1)
    return stubs()[0]


def metric_above(metrics_url: str, name: str, floor: float = 0.0, timeout: float = 10.0, **labels: str) -> float:
    """A metric's value once it exceeds `floor`: what a request adds once it has ended is exported
    within the server's metrics flush interval, not with its last response."""
    deadline = time.monotonic() + timeout
    while (value := metric_value(metrics_url, name, **labels)) <= floor and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


NEAR_TIE = 0.25
"""A greedy token this close to the runner-up may flip with llama.cpp's batch shape (measured
batched-vs-alone logit differences: <= 0.08); a real mistake misses by whole units."""


class NearTies:
    """Checks that an output differing from the reference greedy output leaves it at a near tie of
    the LLM's logits, and prints where: the one allowed difference on a llama.cpp verifier whose
    many-token steps use other kernels than one-token steps. A `batch_invariant` LLM allows none. The
    engine is loaded on first need."""

    def __init__(self, server) -> None:
        self.server = server
        self._checker = None
        self.exact = EngineSettings.from_yaml(server.deployment.raw["llm"]).batch_invariant

    def assert_same_or_near_tie(self, prompt: str, reference: str, other: str, what: str) -> None:
        if other == reference:
            return
        assert not self.exact, f"{what} left the reference on a batch-invariant LLM:\n{reference!r}\n{other!r}"
        if self._checker is None:
            from tests.support.near_tie import NearTieChecker

            self._checker = NearTieChecker(self.server.deployment)
        where = self._checker.divergence(prompt, reference, other)
        print(f"{what} diverged: {where}")
        assert where is not None and where.gap < NEAR_TIE, f"{what}: not a near tie: {where}"


def served(deploy: Path, build: Path, edit: Callable[[Path], None] | None = None, known_crash: str | None = None):
    """A fixture's body: the real tritonserver with `deploy` (its rendered repository changed by `edit`),
    yielded while it runs; after, it must have stopped cleanly, every stub included (no crash at unload),
    unless its log shows `known_crash`, a Triton bug the module triggers on purpose."""
    with TritonProcess(deploy, log_path=build / "tritonserver.log", build=build, edit=edit) as proc:
        yield proc
    if proc.proc.returncode != 0 and known_crash and known_crash in proc.log_text():
        print(f"tritonserver exited with {proc.proc.returncode} after Triton's known crash: {known_crash}")
        return
    assert proc.proc.returncode == 0, f"tritonserver did not shut down cleanly:\n{proc.log_text()[-3000:]}"
    assert "Fatal Python error" not in proc.log_text(), f"a stub crashed:\n{proc.log_text()[-3000:]}"


@contextlib.contextmanager
def serving_killed_stubs(deploy: Path, build: Path):
    """A server for a test that kills stubs with SIGKILL, stopped after a 5 s exit timeout instead of
    Triton's 30 s. Triton 2.51 keeps a killed stub's instance while requests it never answered are
    pending, waits its exit timeout for it at shutdown, then exits with 1 by itself ("Exit timeout
    expired"): a Triton limitation (docs/operations.md), checked here so a change shows up, as is any
    crash."""
    with TritonProcess(deploy, log_path=build / "tritonserver.log", build=build,
                       triton_args=KILLED_STUBS_EXIT_TIMEOUT) as proc:
        yield proc
    assert proc.proc.returncode in (0, 1), f"tritonserver had to be killed:\n{proc.log_text()[-3000:]}"
    assert not re.search(r"Signal \((6|11)\)", proc.log_text()), f"tritonserver crashed:\n{proc.log_text()[-3000:]}"
