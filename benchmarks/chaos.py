"""Chaos: load on a fresh server while stubs are killed and models reloaded at seeded random intervals.

What must never happen fails the run; what may happen under faults (refusals, errors) is counted.

    python -m benchmarks.chaos [--minutes 15] [--seed 1] [--faults ssm_kill,llm_kill,minions_kill,reload]
                               [--cover [--max-minutes 30]]

Load: `--users` client threads, each a closed loop of streamed requests (gRPC ModelStreamInfer, HTTP
SSE generate_stream, or a streamed chat completion through the OpenAI frontend; speculation `off` or
`vote`; picked at random per request), made through the client library exactly as the Locust users
of loadtest/ make them, and through the `openai` package. They are threads here rather than
headless Locust because the verdict needs each request's own ending (an incomplete stream must not be
folded into "error") and a mix of modes in one run. Each request ends in one of:

- served: its final response arrived;
- refused: the server said to retry later (UNAVAILABLE, 503/429, `minions.errors.is_refusal`);
- failed: the server (or the transport) returned an error message;
- incomplete: the stream ended without a final response and without an error;
- hung: silent for `--hang-s` s (then cancelled), or still running when the load was told to stop and
  `--hang-s` more passed;
- orphaned: a gRPC or HTTP request hung that was under way when the orchestrator's stub was killed.
  Triton 2.51 (and 25.12) never answers those: python_backend ends a decoupled request only through
  its stub, and nothing else in the server holds it. They are counted, not failed on; the OpenAI
  frontend ends its own (minions/frontend/orphans.py), so an OpenAI request that hangs is a problem.

Faults are dealt from a shuffled deck of every (kind, model) pair, reshuffled when empty, so a run meets
each before any repeats: `ssm_kill` (SIGKILL an SSM's stub, at a moment it holds no shared-memory lock:
harness/stub_kill.py), `llm_kill`, `minions_kill`, `reload`
(touch the model's files and load it through the repository API, as an operator after an edit). After
each fault the tool waits until the model has recovered (a new stub of it runs and Triton logged it
loaded again), for at most `--recovery-s`, then until a request sent after the fault has been served
(the service is back: the orchestrator finds a dead SSM or LLM through the calls and polls of requests,
so the next fault waits for traffic), for at most `--hang-s` + `--recovery-s`; then it waits the fault's
gap (drawn from the seed) before the next. A stub still dead at the deadline is a problem; the tool then
loads the model itself, as an operator would, so the run goes on. The server runs as `make serve` runs
it: tritonserver, with `make serve`'s watchdog of the orchestrator's stub (deploy/watchdog.py) and the
OpenAI frontend beside it.

It fails (exit 1, one line per problem) on a hung or incomplete request, a request that took more
than `--slow-s` to end however it ended (a crawl is not a hang: its stream is never silent), a
tritonserver exit or a crash in its log ("Signal (", "Fatal Python error"), a stub left dead beyond
`--recovery-s`, a reload that failed, no request sent after a fault served within `--slow-s` of it
(the tool still waits up to its deadline, so that the run goes on), shared-memory regions of
the server's stubs in /dev/shm that no live process maps once the load has stopped, regions left
once tritonserver has stopped (but a killed stub's: Triton 2.51 holds a dead stub's instance, and
its region, until it exits, and leaves it to the launcher's sweep), a stub still running after
tritonserver exited, a stop that needed SIGKILL, and steady growth of the total RSS of tritonserver
and its stubs after warm-up (benchmarks/trend.py; samples taken while a fault has not settled are
left out). The llama.cpp engines' host-memory prefix store, a cache that fills up to its bound as
requests finish, is held to LEAK_CHECK_RAM_MIB for the run, so that its filling is not read as
growth. Refusals and failures with an error message are counted, not failed on.

It writes bench_results/chaos/<timestamp>.json (every figure, each fault with its recovery and how the
requests under way at it and sent during it ended, the memory samples), <timestamp>.txt (the summary
it prints) and <timestamp>.tritonserver.log.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import openai
import yaml

from client.api import Completion, GenerationParams, MinionsClientError, SilentStreamError, generate_grpc, generate_http
from loadtest.records import GRPC_TRANSPORT_FAILURES, UNAVAILABLE_STATUSES
from loadtest.summary import percentiles
from minions.deploy.config import load_deployment
from minions.deploy.watchdog import WATCH_INTERVAL_S, StubWatchdog
from minions.settings import PREFIX_CACHING_ENGINES
from minions.errors import is_refusal
from minions.text.datasets import exit_on_missing_set, mixed_prompts, named_sets, require
from minions.triton.shm import SHM_PREFIX, mapped_shm_regions
from harness.openai_frontend import openai_frontend
from harness.stub_kill import kill_outside_locks
from harness.triton_process import ROOT, TritonProcess, stop_process

from .trend import Trend, trend

LEAK_CHECK_RAM_MIB = 64
"""`prefix_cache_ram_mib` of every llama.cpp or torch engine during a chaos run (below the memory check's 128 MiB
tolerance): the memory check looks for leaks, not for a bounded cache filling."""
FAULT_KINDS = ("ssm_kill", "llm_kill", "minions_kill", "reload")
SERVED, REFUSED, FAILED, INCOMPLETE, HUNG, ORPHANED = "served", "refused", "failed", "incomplete", "hung", "orphaned"
OUTCOMES = (SERVED, REFUSED, FAILED, INCOMPLETE, HUNG, ORPHANED)
CRASH_MARKS = ("Signal (", "Fatal Python error")
"""In tritonserver's log before it is asked to stop: a signal it caught (SIGSEGV, SIGABRT...), or a
stub's native crash (faulthandler). A SIGKILLed stub leaves neither."""
PROTOCOLS = ("grpc", "http", "openai")
TRITON_PROTOCOLS = ("grpc", "http")
"""The clients of Triton's own endpoints: a request of theirs on a killed orchestrator stub is orphaned."""
MODES = ("off", "vote")
MIB = 2**20
SETTLE_S = 10.0
"""After a fault's recovery, how long memory samples still count as unsettled: a reloaded model's old
instance is unloaded once its last calls are answered (the orchestrator's streams retire after 10 s)."""


# -- the pure parts: schedule, outcomes, memory, problems ----------------------------------------------
@dataclass(frozen=True)
class Fault:
    kind: str
    model: str
    gap_s: float
    """Seconds to wait, after the previous fault has settled, before this one."""


def parse_faults(text: str) -> tuple[str, ...]:
    """`ssm_kill,reload` -> the kinds, in FAULT_KINDS order; ValueError naming an unknown one."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kind(s) {unknown or text!r}: choose from {','.join(FAULT_KINDS)}")
    return tuple(k for k in FAULT_KINDS if k in kinds)


def fault_deck(kinds: Iterable[str], llm: str, orchestrator: str, ssms: Sequence[str]) -> list[tuple[str, str]]:
    """Every (kind, model) pair the kinds stand for: a kill per SSM, the LLM's, the orchestrator's, and a
    reload of each model."""
    targets = {"ssm_kill": list(ssms), "llm_kill": [llm], "minions_kill": [orchestrator],
               "reload": [llm, orchestrator, *ssms]}
    return [(kind, model) for kind in kinds for model in targets[kind]]


def fault_schedule(seed: int, deck: Sequence[tuple[str, str]], min_gap_s: float, max_gap_s: float) -> Iterator[Fault]:
    """Faults without end, from `seed` alone: the deck dealt in a shuffled order, reshuffled once dealt
    (every pair comes once before any comes again), each with a gap drawn uniformly from the range. The
    first deal opens with one fault of each kind, so a run long enough for that many faults meets
    every kind, however slowly the machine recovers from them."""
    if not deck:
        raise ValueError("no fault to inject")
    rng = random.Random(seed)
    first = True
    while True:
        order = list(deck)
        rng.shuffle(order)
        if first:
            order, first = _each_kind_first(order), False
        for kind, model in order:
            yield Fault(kind, model, round(rng.uniform(min_gap_s, max_gap_s), 3))


def _each_kind_first(order: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`order` with each kind's first pair moved to the front, in their order."""
    openers: dict[str, tuple[str, str]] = {}
    for kind, model in order:
        openers.setdefault(kind, (kind, model))
    return [*openers.values(), *(pair for pair in order if pair not in openers.values())]


def classify(completion: Completion | None, exc: BaseException | None) -> tuple[str, str]:
    """A request's outcome (OUTCOMES) and what says so: its finish reason, or the error."""
    if exc is None:
        assert completion is not None
        if completion.finish_reason is None:
            return INCOMPLETE, f"the stream ended after {len(completion.chunks)} chunks without a final response"
        return SERVED, completion.finish_reason
    if isinstance(exc, (SilentStreamError, openai.APITimeoutError)):
        return HUNG, str(exc)
    message = str(exc).strip()
    if isinstance(exc, openai.APIStatusError):
        return (REFUSED if exc.status_code in (429, 503) else FAILED), f"{exc.status_code}: {message}"
    if isinstance(exc, openai.APIConnectionError):
        return (FAILED if "refused" in repr(exc.__cause__).lower() else INCOMPLETE), f"{type(exc).__name__}: {message}"
    if isinstance(exc, openai.APIError):  # an error event in the stream: the server's message
        return (REFUSED if is_refusal(message) else FAILED if message else INCOMPLETE), message
    if is_refusal(message):  # a refusal inside a stream carries no status
        return REFUSED, message
    if isinstance(exc, MinionsClientError):
        lost = exc.status == "StatusCode.UNAVAILABLE" and any(m in message for m in GRPC_TRANSPORT_FAILURES)
        if exc.status in UNAVAILABLE_STATUSES and not lost:
            return REFUSED, message
        return (FAILED, message) if message else (INCOMPLETE, f"an error without a message (status {exc.status})")
    if isinstance(exc, (ConnectionRefusedError, OSError)) and "refused" in message.lower():
        return FAILED, f"{type(exc).__name__}: {message}"  # nothing listens: said at once, clearly
    # the connection broke mid-stream (reset, IncompleteRead, a half event): no final response, no error
    return INCOMPLETE, f"{type(exc).__name__}: {message}"


def orphaned(results: Iterable[RequestResult], kills: Iterable[float]) -> list[RequestResult]:
    """The results with each gRPC or HTTP request that hung while under way at a kill of the orchestrator's
    stub (at `kills`, seconds into the run) marked ORPHANED."""
    kills = list(kills)
    return [replace(r, outcome=ORPHANED) if r.outcome == HUNG and r.protocol in TRITON_PROTOCOLS
            and any(r.start < t <= r.end for t in kills) else r for r in results]


def memory_trend(samples: Sequence[tuple[float, int, bool]], warmup_s: float, growth_bytes: float,
                 min_samples: int = 6) -> Trend | None:
    """The total RSS's trend over the samples (seconds into the run, bytes, settled) taken after warm-up
    and while no fault was unsettled (a killed stub's memory is gone until it is back, a reloading model
    has two instances): growing when it climbs from each third to the next and by more than
    max(growth_bytes, 10% of the first third's median). None when there are too few samples to judge."""
    after = [rss for t, rss, settled in samples if t >= warmup_s and settled]
    if len(after) < min_samples:
        return None
    first = sorted(after[: len(after) // 3])[len(after) // 6]
    return trend("tritonserver + stubs RSS", after, tolerance=max(growth_bytes, 0.1 * first), min_samples=min_samples)


def leaked_regions(ours: Iterable[str], present: Iterable[str], mapped: Iterable[str]) -> list[str]:
    """Regions of this server's stubs still in /dev/shm that no process maps."""
    return sorted(set(ours) & set(present) - set(mapped))


def slow_requests(results: Iterable[RequestResult], slow_s: float) -> list[RequestResult]:
    """The requests that ended more than `slow_s` after they were sent, however they ended (hung and
    orphaned requests are counted as such)."""
    return [r for r in results if r.outcome not in (HUNG, ORPHANED) and r.end - r.start > slow_s]


def duration_figures(results: Iterable[RequestResult]) -> dict[str, float | None]:
    """Median, 99th percentile (loadtest.summary.percentiles) and longest time from sending to the final
    response of served requests."""
    seconds = [r.end - r.start for r in results if r.outcome == SERVED]
    pct = percentiles(seconds)
    return {"p50_s": _round(pct["p50"]), "p99_s": _round(pct["p99"]), "max_s": _round(max(seconds, default=None))}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def crash_lines(log_text: str) -> list[str]:
    return [line.strip() for line in log_text.splitlines() if any(m in line for m in CRASH_MARKS)]


def uncovered(kinds: Iterable[str], faults: Iterable[str], served: Iterable[tuple[str, str]]) -> list[str]:
    """What a covering run (--cover) has yet to meet: fault kinds never injected (`faults`: the kinds
    injected), and protocol-and-mode pairs (PROTOCOLS x MODES) with no request served (`served`)."""
    injected, served = set(faults), set(served)
    return ([f"no {kind} fault" for kind in kinds if kind not in injected]
            + [f"no {protocol} {mode} request served" for protocol in PROTOCOLS for mode in MODES
               if (protocol, mode) not in served])


def problems(report: dict) -> list[str]:
    """One line per reason the run fails, from its report."""
    out = []
    outcomes = report["requests"]["outcomes"]
    for outcome, what in ((HUNG, "hung (silent past the deadline, or stuck)"),
                          (INCOMPLETE, "ended without a final response")):
        if outcomes.get(outcome):
            examples = "; ".join(report["requests"]["examples"].get(outcome, [])[:2])
            out.append(f"{outcomes[outcome]} request(s) {what}: {examples}")
    slow, slow_s = report["requests"]["slow"], report["settings"]["slow_s"]
    if slow:
        out.append(f"{len(slow)} request(s) took more than {slow_s:g} s to end (the longest "
                   f"{max(x['seconds'] for x in slow):.1f} s): " + "; ".join(x["what"] for x in slow[:2]))
    if report["requests"]["total"] == 0:
        out.append("no request was made")
    if report["server"]["exited_during_run"] is not None:
        out.append(f"tritonserver exited during the run with code {report['server']['exited_during_run']}")
    out += [f"crash in tritonserver's log: {line}" for line in report["server"]["crash_lines"]]
    if report["server"]["exit_code"] not in (0, 1, None):
        out.append(f"tritonserver did not stop by itself on SIGINT (exit code {report['server']['exit_code']})")
    for f in report["faults"]:
        if f["error"]:
            out.append(f"{f['kind']} {f['model']} at {f['t']:.0f} s: {f['error']}")
        elif f["recovered_s"] is None:
            out.append(f"{f['kind']} {f['model']} at {f['t']:.0f} s: its stub was still dead after "
                       f"{report['settings']['recovery_s']:g} s (restored by the chaos tool: {f['restored']})")
        if not f["error"] and f.get("served_again_s", 0) is None:
            out.append(f"{f['kind']} {f['model']} at {f['t']:.0f} s: no request sent after it was served within "
                       f"{report['settings']['hang_s'] + report['settings']['recovery_s']:g} s")
        elif not f["error"] and f["recovered_s"] is not None and f.get("served_again_s", 0) > slow_s:
            out.append(f"{f['kind']} {f['model']} at {f['t']:.0f} s: a request sent after it was served only "
                       f"{f['served_again_s']:.1f} s after it (more than {slow_s:g} s)")
    out += [f"shared memory leaked (no live process maps it) once the load stopped: {r}"
            for r in report["shm"]["leaked"]]
    out += [f"shared memory left in /dev/shm after the stop: {r}" for r in report["shm"]["left_after_stop"]]
    out += [f"stub still running after tritonserver exited: {stub}" for stub in report.get("stubs_after_stop", [])]
    if report["memory"]["verdict"] and "GROWING" in report["memory"]["verdict"]:
        out.append(f"memory grew steadily after warm-up: {report['memory']['verdict']}")
    out += [f"the run ended at --max-minutes with {what}" for what in report.get("uncovered", [])]
    for warning in report.get("warnings", []):
        out.append(warning)
    return out


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


# -- load --------------------------------------------------------------------------------------------
@dataclass
class RequestResult:
    worker: int
    protocol: str
    speculation: str
    start: float
    """Seconds into the run."""
    end: float
    outcome: str
    detail: str
    tokens: int = 0


def generate_openai(url: str, model: str, prompt: str, params: GenerationParams, stream: bool = True,
                    timeout_s: float = 600.0) -> Completion:
    """`params` as a chat completion through the OpenAI frontend at `url` (its /v1), read as the client
    library reads Triton's answers; silent for `timeout_s` between two chunks raises APITimeoutError."""
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout_s)
    start = time.monotonic()
    completion = Completion()
    answer = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=params.max_tokens, temperature=0,
        stream=stream, stream_options={"include_usage": True} if stream else None,
        extra_body={"speculation": params.speculation} if params.speculation else None)
    for chunk in answer if stream else [answer]:
        if chunk.usage is not None:
            completion.num_input_tokens = chunk.usage.prompt_tokens
            completion.num_output_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text = choice.delta.content if stream else choice.message.content
            if text:
                completion.ttft_s = completion.ttft_s or time.monotonic() - start
                completion.chunks.append(text)
            completion.finish_reason = choice.finish_reason or completion.finish_reason
    completion.text = "".join(completion.chunks)
    completion.latency_s = time.monotonic() - start
    return completion


CALLS = {"grpc": generate_grpc, "http": generate_http, "openai": generate_openai}
"""How a user makes a request, by protocol: (url, model, prompt, params, stream, timeout_s) -> Completion."""


class Load:
    """`users` threads, each streaming requests one after another until stopped."""

    def __init__(self, server: TritonProcess, urls: dict[str, str], users: int, seed: int, prompts: list[str],
                 max_tokens: int, hang_s: float, t0: float) -> None:
        """`urls`: where each protocol's requests go (PROTOCOLS)."""
        self.server, self.prompts, self.max_tokens, self.hang_s, self.t0 = server, prompts, max_tokens, hang_s, t0
        self.urls = urls
        self.model = server.deployment.orchestrator_name
        self.results: list[RequestResult] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i, random.Random(seed * 1000 + i)), daemon=True,
                                         name=f"chaos-user-{i}") for i in range(users)]

    def _run(self, worker: int, rng: random.Random) -> None:
        for n in itertools.count(worker * 7):
            if self.stopping.is_set():
                return
            protocol, mode = rng.choice(PROTOCOLS), rng.choice(MODES)
            params = GenerationParams(max_tokens=self.max_tokens, speculation=mode, chat=True, return_perf_metrics=True)
            start = time.monotonic()
            completion, error = None, None
            try:
                completion = CALLS[protocol](self.urls[protocol], self.model, self.prompts[n % len(self.prompts)],
                                             params, stream=True, timeout_s=self.hang_s)
            except Exception as exc:  # every ending is classified, none dropped
                error = exc
            outcome, detail = classify(completion, error)
            result = RequestResult(worker, protocol, mode, start - self.t0, time.monotonic() - self.t0, outcome,
                                   detail, completion.num_output_tokens if completion else 0)
            with self.lock:
                self.results.append(result)
            if outcome != SERVED:
                self.stopping.wait(1.0)  # a dead server is not spun on (as the Locust users do)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> list[int]:
        """Stop after the requests under way; the workers still in one `hang_s` + 30 s later (stuck)."""
        self.stopping.set()
        deadline = time.monotonic() + self.hang_s + 30
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [i for i, t in enumerate(self.threads) if t.is_alive()]


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


# -- faults ------------------------------------------------------------------------------------------
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

        for path in (self.server.build / "model_repository" / model).glob("[0-9]*/*"):
            os.utime(path)
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            client.load_model(model, client_timeout=self.recovery_s)
        finally:
            client.close()


# -- the run -----------------------------------------------------------------------------------------
@dataclass
class Settings:
    deploy: str = str(ROOT / "deploy.yaml")
    minutes: float = 15.0
    seed: int = 1
    faults: tuple[str, ...] = FAULT_KINDS
    users: int = 4
    max_tokens: int = 64
    hang_s: float = 120.0
    slow_s: float = 60.0
    """A request that takes longer to end fails the run, as does a fault after which no request is served
    this soon: the default deployment serves the run's requests in under 10 s on 2 cores."""
    recovery_s: float = 90.0
    cover: bool = False
    """Go on past `minutes` until every fault kind has been injected and every protocol and mode has had
    a request served, for at most `max_minutes`: the run is judged on what it met, however slow the machine."""
    max_minutes: float = 30.0
    min_gap_s: float = 10.0
    max_gap_s: float = 40.0
    sample_s: float = 5.0
    warmup_min: float = 3.0
    growth_mib: float = 128.0
    leak_wait_s: float = 30.0
    datasets: str = ""
    """Comma-separated prompt sets; empty: the chat sets (datasets/README.md)."""
    prompts: int = 200
    out: str = str(ROOT / "bench_results" / "chaos")
    exit_timeout_s: int = 30
    """tritonserver's --exit-timeout-secs: how long its stop waits for a killed stub's instance."""


def window_outcomes(results: list[RequestResult], start: float, end: float,
                    since: float = 0.0) -> dict[str, dict[str, int]]:
    """How the requests under way at `start` (a fault's injection) that were sent after `since` (the
    previous fault's recovery or deadline: not already caught by it), and those sent from `start` to `end`
    (its recovery, or deadline), ended."""
    return {"in_flight": dict(Counter(r.outcome for r in results if since <= r.start < start <= r.end)),
            "sent_during": dict(Counter(r.outcome for r in results if start <= r.start <= end))}


def summarize_requests(results: list[RequestResult], stuck: list[int], slow_s: float) -> dict:
    outcomes = Counter(r.outcome for r in results)
    outcomes[HUNG] += len(stuck)
    examples: dict[str, list[str]] = {}
    errors: Counter = Counter()
    for r in results:
        if r.outcome != SERVED:
            if len(examples.setdefault(r.outcome, [])) < 5:
                examples[r.outcome].append(f"[{r.protocol} {r.speculation} at {r.start:.0f} s] {r.detail[:300]}")
            errors[re.sub(r"\d+", "N", r.detail[:160])] += 1
    for worker in stuck:
        examples.setdefault(HUNG, []).append(f"user {worker}'s request never returned")
    slow = [{"seconds": round(r.end - r.start, 1),
             "what": f"[{r.protocol} {r.speculation} at {r.start:.0f} s] {r.outcome} after {r.end - r.start:.1f} s, "
                     f"{r.tokens} tokens"} for r in slow_requests(results, slow_s)]
    return {"total": len(results) + len(stuck), "outcomes": {o: outcomes.get(o, 0) for o in OUTCOMES},
            "served_seconds": duration_figures(results), "slow": slow,
            "by_mode": {f"{p} {m}": dict(Counter(r.outcome for r in results if (r.protocol, r.speculation) == (p, m)))
                        for p in PROTOCOLS for m in MODES},
            "tokens": sum(r.tokens for r in results), "examples": examples,
            "errors": [{"count": n, "message": msg} for msg, n in errors.most_common(12)]}


def leak_check_deployment(deploy: str, path: Path) -> Path:
    """The deployment written to `path` with every llama.cpp engine's host-memory prefix store held to
    LEAK_CHECK_RAM_MIB (its cache_dir made absolute, as the copy lives elsewhere)."""
    raw = yaml.safe_load(Path(deploy).read_text())
    raw["cache_dir"] = str(load_deployment(deploy).cache_dir)
    for entry in [raw.get("llm") or {}, *(raw.get("ssms") or [])]:
        if entry.get("engine") in PREFIX_CACHING_ENGINES:
            entry["prefix_cache_ram_mib"] = min(entry.get("prefix_cache_ram_mib", LEAK_CHECK_RAM_MIB),
                                                LEAK_CHECK_RAM_MIB)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def chaos(s: Settings, out: Path, stamp: str) -> dict:
    """Start the server, run load and faults for `s.minutes` (with `s.cover`, until the run has met every
    fault kind and every protocol and mode served), stop, and return the report."""
    kinds = tuple(s.faults)
    server = TritonProcess(leak_check_deployment(s.deploy, out / f"{stamp}.deploy.yaml"),
                           log_path=out / f"{stamp}.tritonserver.log",
                           triton_args=(f"--exit-timeout-secs={s.exit_timeout_s}",))
    dep = server.deployment
    deck = fault_deck(kinds, dep.llm.get("name", "llm"), dep.orchestrator_name, [m["name"] for m in dep.ssms])
    warnings: list[str] = []
    with server, contextlib.ExitStack() as frontend:
        openai_url = frontend.enter_context(openai_frontend(server, out / f"{stamp}.frontend.log",
                                                            dep.orchestrator_name))
        t0 = time.monotonic()
        prompts = mixed_prompts(s.prompts, named_sets(s.datasets))
        urls = {"grpc": server.grpc_url, "http": server.http_url, "openai": openai_url}
        for protocol in PROTOCOLS:
            outcome, detail = classify(*_attempt(CALLS[protocol], urls[protocol], dep.orchestrator_name, prompts[0]))
            if outcome != SERVED:
                warnings.append(f"the warm-up request over {protocol} was not served: {outcome}: {detail}")
        until, last = time.monotonic() + 60 * s.minutes, time.monotonic() + 60 * max(s.minutes, s.max_minutes)
        load = Load(server, urls, s.users, s.seed, prompts, s.max_tokens, s.hang_s, t0)
        injector = Injector(server, load, fault_schedule(s.seed, deck, s.min_gap_s, s.max_gap_s),
                            s.recovery_s, s.hang_s + s.recovery_s, t0, s.seed)

        def missing() -> list[str]:
            if not s.cover:
                return []
            with load.lock:
                served = [(r.protocol, r.speculation) for r in load.results if r.outcome == SERVED]
            return uncovered(kinds, [f.kind for f in injector.records if f.recovered_s is not None], served)

        sampler = Sampler(server, s.sample_s, t0, injector.settled)
        start_memory = sampler.sample()
        sampler.start()
        load.start()
        watchdog = Watchdog(server)
        watchdog.start()
        injector.start()
        while server.proc.poll() is None and time.monotonic() < last and (
                time.monotonic() < until or missing()):
            time.sleep(1.0)
        print(f"[{time.monotonic() - t0:6.1f} s] time is up: waiting for the last fault to settle and the requests "
              "under way to end", flush=True)
        still_missing = missing()
        injector.stopping.set()
        injector.join(2 * s.recovery_s + s.hang_s + 120)
        if injector.is_alive() or injector.error:
            warnings.append(f"the fault injector did not finish: {injector.error or 'still running'}")
        stuck = load.stop()
        watchdog.done.set()
        exited = server.proc.poll()
        sampler.done.set()
        sampler.join()
        # memory at the end once the last fault has settled (a reloaded model's old instance gone)
        time.sleep(max(0.0, min(SETTLE_S, injector.unsettled_until - time.monotonic())))
        end_memory = sampler.sample() if exited is None else {}
        crashes = crash_lines(server.log_text())
        leaked = _leaked_after(sampler.regions, s.leak_wait_s) if exited is None else []
        frontend.close()  # the frontend first, as `make serve` stops them
        # the stop, checked before TritonProcess.stop ends stray stubs and sweeps what they left
        stop_process(server.proc, signal.SIGINT, 90.0)
        strays = _stubs_after_stop(server, 15.0)
        present = {p.name for p in Path("/dev/shm").glob(SHM_PREFIX + "*")}
        left = leaked_regions(sampler.regions, present, mapped_shm_regions())
    results = orphaned(load.results, [f.t for f in injector.records if f.kind == "minions_kill"])
    killed = {f.region for f in injector.records if f.kind.endswith("_kill") and f.region}
    faults, since = [], 0.0
    for f in injector.records:
        end = f.t + max(f.recovered_s if f.recovered_s is not None else s.recovery_s, f.served_again_s or 0.0)
        f.requests = window_outcomes(results, f.t, end, since)
        faults.append(asdict(f))
        since = end
    recoveries = [f["recovered_s"] for f in faults if f["recovered_s"] is not None]
    verdict = memory_trend([(x["t"], x["total"], x["settled"]) for x in sampler.samples],
                           60 * min(s.warmup_min, s.minutes / 3), s.growth_mib * MIB)
    duration = time.monotonic() - t0
    report = {
        "settings": {**asdict(s), "faults": list(kinds)}, "stamp": stamp, "duration_s": round(duration, 1),
        "requests": summarize_requests(results, stuck, s.slow_s),
        "faults": faults,
        "faults_by_kind": dict(Counter(f["kind"] for f in faults)),
        "recoveries": {"count": len(recoveries), "not_recovered": sum(f["recovered_s"] is None and not f["error"]
                                                                      for f in faults),
                       "max_s": max(recoveries, default=None),
                       "median_s": sorted(recoveries)[len(recoveries) // 2] if recoveries else None,
                       "by_kind": {k: [f["recovered_s"] for f in faults if f["kind"] == k] for k in kinds},
                       "served_again_by_kind": {k: [f["served_again_s"] for f in faults if f["kind"] == k]
                                                for k in kinds}},
        "watchdog_reloads": watchdog.reloads,
        "server": {"exited_during_run": exited, "exit_code": server.proc.returncode, "crash_lines": crashes[:10]},
        "memory": {"start_bytes": start_memory["total"], "end_bytes": end_memory.get("total"),
                   "start": start_memory["rss"], "end": end_memory.get("rss"),
                   "verdict": str(verdict) if verdict else None, "samples": sampler.samples},
        "shm": {"regions_seen": len(sampler.regions), "leaked": leaked,
                "left_after_stop": [r for r in left if r not in killed],
                "killed_stubs_left_after_stop": [r for r in left if r in killed]},
        "stubs_after_stop": strays,
        "uncovered": still_missing,
        "warnings": warnings,
    }
    report["problems"] = problems(report)
    return report


def _attempt(call, url: str, model: str, prompt: str) -> tuple[Completion | None, BaseException | None]:
    try:
        return call(url, model, prompt, GenerationParams(max_tokens=8, chat=True, speculation="off"),
                    timeout_s=120), None
    except Exception as exc:  # classified by the caller
        return None, exc


def _stubs_after_stop(server: TritonProcess, wait_s: float) -> list[str]:
    """The server's stubs still running `wait_s` after it exited (a stub ends when it sees its parent gone)."""
    deadline = time.monotonic() + wait_s
    while (stubs := stub_processes(server)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"{s.model} (pid {s.pid})" for s in stubs]


def _leaked_after(regions: set[str], wait_s: float) -> list[str]:
    """Regions of the server's stubs that no process maps, once the orchestrator has had `wait_s` to
    sweep them after its last reload."""
    deadline = time.monotonic() + wait_s
    while True:
        present = {p.name for p in Path("/dev/shm").glob(SHM_PREFIX + "*")}
        leaked = leaked_regions(regions, present, mapped_shm_regions())
        if not leaked or time.monotonic() >= deadline:
            return leaked
        time.sleep(1.0)


def format_summary(report: dict) -> str:
    r, s = report["requests"], report["settings"]
    o = r["outcomes"]
    mem = report["memory"]
    rec = report["recoveries"]
    lines = [
        f"Chaos run {report['stamp']}: {report['duration_s'] / 60:.1f} min, {s['users']} users, seed {s['seed']}, "
        f"faults {','.join(s['faults'])}, {Path(s['deploy']).name}",
        f"requests: {r['total']} ({o[SERVED]} served, {o[REFUSED]} refused, {o[FAILED]} failed with an error, "
        f"{o[INCOMPLETE]} incomplete, {o[HUNG]} hung, {o[ORPHANED]} orphaned by Triton: gRPC/HTTP requests under "
        f"way on a killed orchestrator stub, which no server process can answer); {r['tokens']} tokens",
        f"served in (sent to final response): median {_s(r['served_seconds']['p50_s'])}, p99 "
        f"{_s(r['served_seconds']['p99_s'])}, longest {_s(r['served_seconds']['max_s'])}; "
        f"{len(r['slow'])} request(s) took more than {s['slow_s']:g} s",
        "by protocol: " + "; ".join(
            f"{p} " + ", ".join(f"{n} {o}" for o, n in sorted(_by_protocol(r["by_mode"], p).items()))
            for p in PROTOCOLS),
        f"faults: {sum(report['faults_by_kind'].values())} "
        f"({', '.join(f'{k} {n}' for k, n in report['faults_by_kind'].items()) or 'none'}); "
        f"recovered {rec['count']}, not recovered {rec['not_recovered']}; recovery median "
        f"{_s(rec['median_s'])}, max {_s(rec['max_s'])}",
        "recovery by kind (model back / a request sent after the fault served): " + "; ".join(
            f"{k}: {', '.join(f'{_s(x)}/{_s(y)}' for x, y in zip(v, rec['served_again_by_kind'][k])) or '-'}"
            for k, v in rec["by_kind"].items()),
        f"make serve's watchdog loaded the orchestrator again {report['watchdog_reloads']} time(s)",
        f"crashes: {len(report['server']['crash_lines']) + (report['server']['exited_during_run'] is not None)}; "
        f"tritonserver exit code {report['server']['exit_code']}",
        f"memory (tritonserver + stubs RSS): {_mib(mem['start_bytes'])} at start, {_mib(mem['end_bytes'])} at end; "
        f"{mem['verdict'] or 'too few samples after warm-up to judge a trend'}",
        f"/dev/shm: {report['shm']['regions_seen']} regions seen, {len(report['shm']['leaked'])} leaked while "
        f"serving, {len(report['shm']['left_after_stop'])} left after the stop (and "
        f"{len(report['shm']['killed_stubs_left_after_stop'])} of killed stubs, which tritonserver holds until it "
        "exits and then leaves to the launcher's sweep)",
    ]
    if r["errors"]:
        lines.append("errors: " + "; ".join(f"{e['count']}x {e['message'][:120]}" for e in r["errors"][:5]))
    lines.append(f"FAILED: {len(report['problems'])} problem(s)" if report["problems"] else "PASSED")
    lines += report["problems"]
    return "\n".join(lines)


def _by_protocol(by_mode: dict[str, dict[str, int]], protocol: str) -> Counter:
    return sum((Counter(outcomes) for key, outcomes in by_mode.items() if key.split()[0] == protocol), Counter())


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def _mib(x: int | None) -> str:
    return "-" if x is None else f"{x / MIB:.0f} MiB"


def parse_args(argv: list[str] | None = None) -> Settings:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--deploy", default=d.deploy, help="deployment of the fresh server")
    p.add_argument("--minutes", type=float, default=d.minutes, help="minutes of load and faults")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the faults, their gaps and the requests")
    p.add_argument("--faults", default=",".join(d.faults), help="fault kinds, comma-separated: "
                   + ",".join(FAULT_KINDS))
    p.add_argument("-u", "--users", type=int, default=d.users, help="concurrent client streams")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="output tokens per request")
    p.add_argument("--hang-s", type=float, default=d.hang_s, help="a request silent this long is hung")
    p.add_argument("--slow-s", type=float, default=d.slow_s,
                   help="a request taking longer to end, or a fault after which none is served this soon, "
                   "fails the run")
    p.add_argument("--recovery-s", type=float, default=d.recovery_s, help="a stub dead this long is not recovered")
    p.add_argument("--cover", action="store_true",
                   help="go on past --minutes until every fault kind was injected and recovered from, and every "
                   "protocol and mode had a request served")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help="with --cover: the longest run; what it has not met by then fails it")
    p.add_argument("--min-gap-s", type=float, default=d.min_gap_s, help="shortest wait between faults")
    p.add_argument("--max-gap-s", type=float, default=d.max_gap_s, help="longest wait between faults")
    p.add_argument("--sample-s", type=float, default=d.sample_s, help="memory sampling interval")
    p.add_argument("--warmup-min", type=float, default=d.warmup_min,
                   help="memory samples before this (at most a third of the run) are not judged")
    p.add_argument("--growth-mib", type=float, default=d.growth_mib,
                   help="steady RSS growth beyond max(this, 10%%) after warm-up fails the run")
    p.add_argument("--datasets", default=d.datasets,
                   help="prompt sets, comma-separated (datasets/README.md); empty: the chat sets")
    p.add_argument("--out", default=d.out, help="where the report goes")
    p.add_argument("--exit-timeout-s", type=int, default=d.exit_timeout_s,
                   help="tritonserver's exit timeout: how long the stop waits for a killed stub's instance")
    a = p.parse_args(argv)
    try:
        faults = parse_faults(a.faults)
    except ValueError as exc:
        p.error(str(exc))
    if not 0 <= a.min_gap_s <= a.max_gap_s:
        p.error("need 0 <= --min-gap-s <= --max-gap-s")
    if a.slow_s <= 0:
        p.error("need --slow-s > 0")
    return Settings(deploy=a.deploy, minutes=a.minutes, seed=a.seed, faults=faults, users=a.users,
                    max_tokens=a.max_tokens, hang_s=a.hang_s, slow_s=a.slow_s, recovery_s=a.recovery_s,
                    cover=a.cover, max_minutes=a.max_minutes, min_gap_s=a.min_gap_s, max_gap_s=a.max_gap_s,
                    sample_s=a.sample_s, warmup_min=a.warmup_min, growth_mib=a.growth_mib, datasets=a.datasets,
                    out=a.out, exit_timeout_s=a.exit_timeout_s)


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    require(named_sets(s.datasets))  # a missing set: one line, before the server starts
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = chaos(s, out, stamp)
    text = format_summary(report)
    (out / f"{stamp}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stamp}.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {out}/{stamp}.json, {stamp}.txt, {stamp}.tritonserver.log")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(exit_on_missing_set(main))
