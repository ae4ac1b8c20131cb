"""A chaos run's report as the summary it prints and writes beside the JSON."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .verdict import FAILED, HUNG, INCOMPLETE, MIB, ORPHANED, PROTOCOLS, REFUSED, SERVED

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
