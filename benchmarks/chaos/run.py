"""A chaos run: the fresh server, its load and faults for the run's length, the stop and its checks, the
report; and the command line (`python -m benchmarks.chaos`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from client.api import Completion, GenerationParams
from harness.openai_frontend import openai_frontend
from harness.triton_process import ROOT, TritonProcess, stop_process
from minions.deploy.config import load_deployment
from minions.settings import PREFIX_CACHING_ENGINES
from minions.text.datasets import mixed_prompts, named_sets, require
from minions.triton.shm import SHM_PREFIX, mapped_shm_regions

from .injector import SETTLE_S, Injector
from .load import CALLS, Load
from .processes import Sampler, Watchdog, stub_processes
from .report import format_summary
from .schedule import FAULT_KINDS, fault_deck, fault_schedule, parse_faults
from .verdict import (MIB, PROTOCOLS, SERVED, classify, crash_lines, leaked_regions, memory_trend, orphaned,
                      problems, summarize_requests, uncovered, window_outcomes)

LEAK_CHECK_RAM_MIB = 64
"""`prefix_cache_ram_mib` of every llama.cpp or torch engine during a chaos run (below the memory check's 128 MiB
tolerance): the memory check looks for leaks, not for a bounded cache filling."""


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
    duration = time.monotonic() - t0
    # warm-up: a third of the run as it went (a covering run goes on past --minutes), at most --warmup-min
    verdict = memory_trend([(x["t"], x["total"], x["settled"]) for x in sampler.samples],
                           min(60 * s.warmup_min, duration / 3), s.growth_mib * MIB)
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


def parse_args(argv: list[str] | None = None) -> Settings:
    d = Settings()
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos",
                                description=sys.modules[__package__].__doc__.splitlines()[0],
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
