"""How a chaos run is judged, from what it recorded: each request's ending, the requests around a fault,
memory growth, leaked shared memory, crash lines, and the problems that fail the run."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import openai

from client.api import Completion, MinionsClientError, SilentStreamError
from loadtest.records import GRPC_TRANSPORT_FAILURES, UNAVAILABLE_STATUSES
from loadtest.summary import percentiles
from minions.errors import is_refusal

from ..trend import Trend, trend

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
