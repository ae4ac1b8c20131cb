"""The load test's PNG: TTFT, inter-token latency and output throughput over the run."""

from __future__ import annotations

from pathlib import Path

from loadtest.records import RequestRecord
from loadtest.summary import Targets, series


def plot(records: list[RequestRecord], targets: Targets, path: Path, title: str) -> None:
    """Three panels over time since the first send: each request's TTFT and ITL (dots, at its end; failures
    as crosses on the TTFT panel) with the median per time bucket and the target, and output tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = series(records)
    t0 = min(r.start for r in records)
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    mid = [row["t_s"] + row["width_s"] / 2 for row in rows]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    panels = (("ttft_s", "ttft_ms_p50", targets.ttft_ms, "time to first token, ms"),
              ("itl_s", "itl_ms_p50", targets.itl_ms, "inter-token latency, ms"))
    for ax, (attr, key, target, label) in zip(axes, panels):
        points = [(r.end - t0, 1000 * getattr(r, attr)) for r in ok if getattr(r, attr) is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=8, alpha=0.4, label="request (at its end)")
        medians = [(m, row[key]) for m, row in zip(mid, rows) if row[key] is not None]
        ax.plot([m[0] for m in medians], [m[1] for m in medians], color="C1", marker="o", label="median per bucket")
        ax.axhline(target, color="C3", linestyle="--", linewidth=1, label=f"target {target:g} ms")
        ax.set_ylabel(label)
    if failed:
        axes[0].scatter([r.end - t0 for r in failed], [0] * len(failed), marker="x", color="C3", label="failed")
    axes[2].step([row["t_s"] for row in rows] + [rows[-1]["t_s"] + rows[-1]["width_s"]],
                 [row["output_tokens_per_s"] for row in rows] + [rows[-1]["output_tokens_per_s"]], where="post")
    axes[2].set_ylabel("output tokens/s")
    axes[2].set_xlabel("seconds since the first request")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
