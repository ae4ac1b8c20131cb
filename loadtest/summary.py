"""From per-request rows to the load test's numbers: percentiles, throughput, goodput, and series over time.

Goodput, as vLLM's benchmark_serving and NVIDIA AIPerf define it: completed requests per second that met
every target, here the time to first token and the mean inter-token latency (each request's
(E2E - TTFT) / (tokens - 1), vLLM's TPOT, AIPerf's ITL), over the run's duration (first send to last end).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from loadtest.records import ERROR, TIMEOUT, UNAVAILABLE, RequestRecord

PERCENTILES = (50, 90, 99)
SERIES_BUCKETS = 20
"""About how many time buckets the series over time has (each at least a second)."""


@dataclass(frozen=True)
class Targets:
    """Service-level targets a request must meet to count towards goodput."""

    ttft_ms: float
    itl_ms: float

    def met_by(self, r: RequestRecord) -> bool:
        """Succeeded, with its first text within ttft_ms and (with two tokens or more) a mean ITL within itl_ms."""
        if not r.ok or r.ttft_s is None or 1000 * r.ttft_s > self.ttft_ms:
            return False
        return r.itl_s is None or 1000 * r.itl_s <= self.itl_ms


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and the mean (linear interpolation, numpy's default); None for no values."""
    if not values:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    out = {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}
    return out | {"mean": float(np.mean(values))}


def duration_s(records: list[RequestRecord]) -> float:
    """First send to last end."""
    return max(r.end for r in records) - min(r.start for r in records) if records else 0.0


def summarize(records: list[RequestRecord], targets: Targets) -> dict:
    """The run's numbers, latencies over the successful requests (ms)."""
    ok = [r for r in records if r.ok]
    span = duration_s(records)
    outcomes = Counter(r.outcome for r in records)
    tokens = sum(r.output_tokens for r in ok)
    good = sum(targets.met_by(r) for r in records)

    def rate(count: float) -> float:
        return count / span if span > 0 else 0.0

    return {
        "requests": len(records),
        "succeeded": len(ok),
        "failed": len(records) - len(ok),
        "unavailable": outcomes[UNAVAILABLE],
        "timeouts": outcomes[TIMEOUT],
        "errors": outcomes[ERROR],
        "by_protocol": {p: {"requests": sum(r.protocol == p for r in records),
                            "failed": sum(r.protocol == p and not r.ok for r in records)}
                        for p in sorted({r.protocol for r in records})},
        "duration_s": span,
        "requests_per_s": rate(len(ok)),
        "output_tokens": tokens,
        "output_tokens_per_s": rate(tokens),
        "ttft_ms": percentiles([1000 * r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": percentiles([1000 * r.itl_s for r in ok if r.itl_s is not None]),
        "e2e_ms": percentiles([1000 * r.e2e_s for r in ok]),
        "goodput": {"ttft_target_ms": targets.ttft_ms, "itl_target_ms": targets.itl_ms, "good_requests": good,
                    "requests_per_s": rate(good), "share": good / len(records) if records else 0.0},
        "first_errors": list(dict.fromkeys(r.error for r in records if r.error))[:5],
    }


def bucket_width(span_s: float, buckets: int = SERIES_BUCKETS) -> float:
    return max(1.0, round(span_s / buckets))


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def series(records: list[RequestRecord], width_s: float | None = None) -> list[dict]:
    """Per time bucket since the first send: median TTFT and ITL of the requests that ended in it, output
    tokens/s (each request's tokens spread evenly from its first text to its end; the last bucket's rate
    over its part of the run), and failures."""
    if not records:
        return []
    t0 = min(r.start for r in records)
    span = duration_s(records)
    width = width_s or bucket_width(span)
    n = max(1, int(np.ceil(span / width)))
    ended_in = [min(int((r.end - t0) // width), n - 1) for r in records]
    rows = []
    for i in range(n):
        b0, b1 = i * width, (i + 1) * width
        ended = [r for r, j in zip(records, ended_in) if j == i]
        ok = [r for r in ended if r.ok]
        tokens = 0.0
        for r, j in zip(records, ended_in):
            if not r.ok or not r.output_tokens:
                continue
            first = r.start - t0 + (r.ttft_s if r.ttft_s is not None else r.e2e_s)
            end = r.end - t0
            if end > first:
                tokens += r.output_tokens * _overlap(first, end, b0, b1) / (end - first)
            elif j == i:
                tokens += r.output_tokens
        ttfts = [1000 * r.ttft_s for r in ok if r.ttft_s is not None]
        itls = [1000 * r.itl_s for r in ok if r.itl_s is not None]
        rows.append({"t_s": b0, "width_s": width, "ended": len(ended), "failed": len(ended) - len(ok),
                     "ttft_ms_p50": float(np.median(ttfts)) if ttfts else None,
                     "itl_ms_p50": float(np.median(itls)) if itls else None,
                     "output_tokens_per_s": tokens / max(min(b1, span) - b0, 1e-9)})
    return rows


def _ms(stats: dict[str, float | None]) -> str:
    return " | ".join("-" if stats[k] is None else f"{stats[k]:.0f}" for k in ("p50", "p90", "p99", "mean"))


def format_markdown(s: dict, title: str = "Minions load test") -> str:
    good = s["goodput"]
    lines = [
        f"# {title}", "",
        f"{s['requests']} requests in {s['duration_s']:.1f} s: {s['succeeded']} succeeded, {s['failed']} failed "
        f"({s['unavailable']} refused as unavailable, {s['timeouts']} silent too long, {s['errors']} other errors).",
        "",
        "| | value |", "|---|---|",
        f"| successful requests/s | {s['requests_per_s']:.2f} |",
        f"| output tokens/s | {s['output_tokens_per_s']:.1f} |",
        f"| goodput (TTFT ≤ {good['ttft_target_ms']:g} ms and ITL ≤ {good['itl_target_ms']:g} ms) | "
        f"{good['requests_per_s']:.2f} requests/s ({good['good_requests']} of {s['requests']}, "
        f"{100 * good['share']:.0f}%) |",
        "",
        "| ms | p50 | p90 | p99 | mean |", "|---|---|---|---|---|",
        f"| time to first token | {_ms(s['ttft_ms'])} |",
        f"| inter-token latency (per request) | {_ms(s['itl_ms'])} |",
        f"| end to end | {_ms(s['e2e_ms'])} |",
        "",
        "| protocol | requests | failed |", "|---|---|---|",
        *(f"| {p} | {v['requests']} | {v['failed']} |" for p, v in s["by_protocol"].items()),
    ]
    if s["first_errors"]:
        lines += ["", "First errors:", "", *(f"- `{e[:300]}`" for e in s["first_errors"])]
    return "\n".join(lines) + "\n"
