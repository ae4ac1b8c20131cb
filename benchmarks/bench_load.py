"""`make bench` (load sweep): throughput and latency of `off`, fixed-length `vote` and full Minions at 1-16 streams.

Each mode runs on a tritonserver of its own (deploy.yaml), so that none finds another's prompts in the
prefix cache, drafts from another's answers (ssm_suffix learns from finished requests) or starts from
the draft lengths another climbed to (the length statistics are server-wide). Every mode gets the same
prompts (the chat sets mixed: datasets/README.md), and each concurrency c and repeat prompts of its own:
c client streams pull max(c, --min-requests) requests from a queue, greedy. Per mode and concurrency:
output tokens/s over the cell's wall time, normalised latency (latency / output tokens), TTFT,
acceptance, the LLM's mean batch and padding share (from the engine's metrics), and the speedup over
`off` measured in the same run. Then: the best
fixed s of `vote` at each concurrency and how far adaptive is from it, the ablation (vote at a fixed s,
+ adaptive length, + pipeline) and PNG plots of throughput and latency against concurrency.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from client.api import GenerationParams, generate_grpc
from minions.text.datasets import (COPY_HEAVY, DATASETS, chat_sets, exit_on_missing_set, mixed_prompts, require,
                                   warm_up_prompts)
from harness.metrics import metric_samples
from harness.triton_process import ROOT, TritonProcess

from .workers import run_streams

FIXED_LENGTHS = (1, 2, 3, 4, 6, 8)
RESPONSE_TIMEOUT_S = 180.0
"""A stream silent this long has lost its server side (a round takes seconds even at 16 streams): it
is cancelled and counted as an error, so that the sweep goes on instead of hanging."""


@dataclass(frozen=True)
class LoadMode:
    label: str
    speculation: str
    num_draft_tokens: int | None
    """None: adaptive."""
    pipeline: bool | None
    """None: the deployment's."""

    def params(self, max_tokens: int) -> GenerationParams:
        return GenerationParams(max_tokens=max_tokens, temperature=0.0, speculation=self.speculation or None,
                                num_draft_tokens=0 if self.speculation == "off" else self.num_draft_tokens,
                                pipeline=self.pipeline, return_perf_metrics=True, chat=True)


def default_modes() -> list[LoadMode]:
    return [
        LoadMode("off", "off", 0, False),
        *(LoadMode(f"vote s={s}", "vote", s, False) for s in FIXED_LENGTHS),
        LoadMode("vote adaptive", "vote", None, False),
        LoadMode("minions", "vote", None, True),  # vote + adaptive + pipeline
    ]


DEPLOYED = LoadMode("default", "", None, None)
"""The deployment's own default, as served (deploy.qwen.yaml's has no pipeline, which `minions` forces)."""


@dataclass
class Cell:
    mode: str
    streams: int
    repeat: int = 0
    """Which pass over the modes this cell was measured in (--repeat)."""
    requests: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    latencies_per_token: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    acceptances: list[float] = field(default_factory=list)
    texts: dict[int, str] = field(default_factory=dict)
    draft_lengths: list[int] = field(default_factory=list)
    llm_batch: float | None = None
    ssm_batch: float | None = None
    """Mean sequences per llama.cpp decode step of ssm_q4."""
    padding_share: float | None = None
    errors: list[str] = field(default_factory=list)

    def row(self) -> dict:
        return {
            "mode": self.mode, "streams": self.streams, "repeat": self.repeat, "requests": self.requests,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / self.wall_s if self.wall_s else 0.0,
            "normalized_latency_ms": 1000 * statistics.mean(self.latencies_per_token) if self.latencies_per_token else None,
            "ttft_ms": 1000 * statistics.median(self.ttfts) if self.ttfts else None,
            "acceptance": statistics.mean(self.acceptances) if self.acceptances else None,
            "mean_draft_length": statistics.mean(self.draft_lengths) if self.draft_lengths else 0.0,
            "llm_batch": self.llm_batch, "ssm_batch": self.ssm_batch, "padding_share": self.padding_share, "errors": len(self.errors),
        }


def engine_totals(metrics_url: str, model: str = "llm") -> dict[str, float]:
    """An engine's batching counters (`minions_engine_batch_total`) by what they count."""
    return {labels["what"]: value
            for labels, value in metric_samples(metrics_url, "minions_engine_batch_total", model=model)}


def run_cell(url: str, metrics_url: str, mode: LoadMode, streams: int, prompts: list[str], max_tokens: int,
             repeat: int = 0) -> Cell:
    cell = Cell(mode.label, streams, repeat)

    def call(prompt: str):
        return generate_grpc(url, "minions", prompt, mode.params(max_tokens), stream=True, timeout_s=RESPONSE_TIMEOUT_S)

    def done(i: int, c) -> None:
        cell.requests += 1
        cell.tokens += c.num_output_tokens
        cell.latencies_per_token.append(c.normalized_latency_s)
        cell.ttfts.append(c.ttft_s or c.latency_s)
        if c.acceptance_rate is not None and mode.speculation != "off":
            cell.acceptances.append(c.acceptance_rate)
        cell.texts[i] = c.text
        cell.draft_lengths += (c.draft_lengths or [])[1:]

    before = {m: engine_totals(metrics_url, m) for m in ("llm", "ssm_q4")}
    cell.wall_s = run_streams(prompts, streams, call, done, lambda exc: cell.errors.append(str(exc)))
    llm = _delta(before["llm"], engine_totals(metrics_url, "llm"))
    ssm = _delta(before["ssm_q4"], engine_totals(metrics_url, "ssm_q4"))
    if llm["passes"]:
        cell.llm_batch = llm["sequences"] / llm["passes"]
        cell.padding_share = llm["pad_tokens"] / max(llm["tokens"], 1)
    if ssm["passes"]:
        cell.ssm_batch = ssm["sequences"] / ssm["passes"]
    return cell


def cell_prompts(streams: list[int], min_requests: int, repeats: int, datasets: list[str] | None
                 ) -> dict[tuple[int, int], list[str]]:
    """Prompts for each (concurrency, repeat): max(c, min_requests) of them, none used by another cell."""
    per_set = len(datasets or chat_sets())
    out, offset = {}, 0
    for c in streams:
        for repeat in range(repeats):
            count = max(c, min_requests)
            out[c, repeat] = mixed_prompts(count, datasets, offset)
            offset += -(-count // per_set)
    return out


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("passes", "sequences", "tokens", "pad_tokens")}


def summarize(cells: list[Cell]) -> list[dict]:
    """One row per cell, its speedup over the `off` cell of the same concurrency and repeat."""
    rows = []
    for streams, repeat in sorted({(c.streams, c.repeat) for c in cells}):
        group = [c for c in cells if c.streams == streams and c.repeat == repeat]
        off = next(c for c in group if c.mode == "off")
        base = off.row()["tokens_per_s"]
        for c in group:
            row = c.row()
            row["speedup"] = row["tokens_per_s"] / base if base else None
            row["identical_to_off"] = sum(off.texts.get(i) == t for i, t in c.texts.items())
            rows.append(row)
    return rows


MEDIAN_KEYS = ("tokens_per_s", "speedup", "normalized_latency_ms", "ttft_ms", "acceptance", "mean_draft_length",
               "llm_batch", "ssm_batch", "padding_share")
SUM_KEYS = ("requests", "tokens", "identical_to_off", "errors")


def pool_repeats(rows: list[dict]) -> list[dict]:
    """One row per mode and concurrency: the median over repeats (sums for counts), with the speedup's
    range. Why the median: one cell at 8-16 streams is a single wave of requests, and its rate swings
    by 10% or more between runs of one build (a wave's slowest request sets its time)."""
    pooled = []
    for streams, mode in dict.fromkeys((r["streams"], r["mode"]) for r in rows):
        group = [r for r in rows if r["streams"] == streams and r["mode"] == mode]
        row = {"mode": mode, "streams": streams, "repeats": len(group)}
        for key in MEDIAN_KEYS:
            values = [r[key] for r in group if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        for key in SUM_KEYS:
            row[key] = sum(r[key] for r in group)
        speedups = [r["speedup"] for r in group if r["speedup"] is not None]
        row["speedup_range"] = (min(speedups), max(speedups)) if speedups else None
        pooled.append(row)
    return pooled


def comparisons(rows: list[dict], per_repeat: list[dict]) -> list[dict]:
    """Per concurrency: best fixed-s vote, adaptive's gap to it, and the ablation steps. `rows` are
    pooled over repeats (`pool_repeats`), `per_repeat` one per cell (`summarize`): the gap is the
    median of each repeat's gap to the length best over all repeats, with its range. Picking the best
    fixed length of each repeat instead would pit adaptive against the luckiest of several noisy cells."""
    out = []
    for streams in sorted({r["streams"] for r in rows}):
        by = {r["mode"]: r for r in rows if r["streams"] == streams}
        fixed = [by[f"vote s={s}"] for s in FIXED_LENGTHS if f"vote s={s}" in by]
        best = max(fixed, key=lambda r: r["tokens_per_s"]) if fixed else None
        entry = {"streams": streams, "best_fixed": best["mode"] if best else None,
                 "best_fixed_speedup": best["speedup"] if best else None}
        for name in ("vote adaptive", "minions"):
            if name in by and best:
                gaps = _gaps(per_repeat, streams, name, best["mode"])
                entry[f"{name} vs best fixed"] = statistics.median(gaps)
                entry[f"{name} vs best fixed range"] = (min(gaps), max(gaps)) if len(gaps) > 1 else None
                entry[f"{name} speedup"] = by[name]["speedup"]
        if "vote s=8" in by:
            entry["vote s=8 speedup"] = by["vote s=8"]["speedup"]
        out.append(entry)
    return out


def _gaps(rows: list[dict], streams: int, mode: str, against: str) -> list[float]:
    """mode's tokens/s over against's, less one, in each repeat at this concurrency (rows per cell)."""
    rate = {(r["repeat"], r["mode"]): r["tokens_per_s"] for r in rows if r["streams"] == streams}
    return [rate[k, mode] / rate[k, against] - 1.0 for k, m in rate if m == mode and rate.get((k, against))]


def _times(ratio: float | None) -> str:
    """A speedup as `1.23x`; `-` where there is none (`off` served nothing in that cell)."""
    return f"{ratio:.2f}x" if ratio is not None else "-"


def format_tables(rows: list[dict], comps: list[dict]) -> str:
    head = (f"{'streams':>7} {'mode':<14} {'tok/s':>7} {'speedup':>8} {'ms/tok':>7} {'TTFT ms':>8} {'accept':>7} "
            f"{'mean s':>6} {'LLM batch':>9} {'SSM batch':>9} {'pad':>5} {'same':>6}")
    repeats = max((r.get("repeats", 1) for r in rows), default=1)
    title = "## Load sweep (greedy; speedup = tokens/s over `off` at the same concurrency, same run)"
    if repeats > 1:
        title += f", medians of {repeats} repeats"
    lines = [title, head, "-" * len(head)]
    for r in rows:
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        batch = f"{r['llm_batch']:.1f}" if r["llm_batch"] is not None else "-"
        ssm_batch = f"{r['ssm_batch']:.1f}" if r.get("ssm_batch") is not None else "-"
        pad = f"{100 * r['padding_share']:.0f}%" if r["padding_share"] is not None else "-"
        lines.append(
            f"{r['streams']:>7} {r['mode']:<14} {r['tokens_per_s']:>7.1f} {_times(r['speedup']):>8} "
            f"{r['normalized_latency_ms'] or 0:>7.0f} {r['ttft_ms'] or 0:>8.0f} {acc:>7} {r['mean_draft_length']:>6.1f} "
            f"{batch:>9} {ssm_batch:>9} {pad:>5} {r['identical_to_off']:>3}/{r['requests']}"
            + (f"  ({r['errors']} errors)" if r["errors"] else "")
            + (f"  speedup {r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f}x" if r.get("repeats", 1) > 1
               and r.get("speedup_range") else "")
        )
    lines += ["", "## Adaptive length against the best fixed s, and the ablation (speedup over off)",
              f"{'streams':>7} {'best fixed':<11} {'its speedup':>11} {'vote s=8':>9} {'+adaptive':>10} {'+pipeline':>10} "
              f"{'adaptive vs best':>16} {'minions vs best':>15}"]
    for c in comps:
        def pct(key):
            return f"{100 * c[key]:+.1f}%" if c.get(key) is not None else "-"

        def x(key):
            return _times(c.get(key))
        lines.append(f"{c['streams']:>7} {c['best_fixed'] or '-':<11} {x('best_fixed_speedup'):>11} {x('vote s=8 speedup'):>9} "
                     f"{x('vote adaptive speedup'):>10} {x('minions speedup'):>10} {pct('vote adaptive vs best fixed'):>16} "
                     f"{pct('minions vs best fixed'):>15}"
                     + "".join(f"  {name} {100 * c[key][0]:+.1f}..{100 * c[key][1]:+.1f}%"
                               for name, key in (("adaptive", "vote adaptive vs best fixed range"),
                                                 ("minions", "minions vs best fixed range")) if c.get(key)))
    return "\n".join(lines)


def plot(rows: list[dict], comps: list[dict], path: Path, deployment: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = sorted({r["streams"] for r in rows})
    best_by_streams = {c["streams"]: c["best_fixed"] for c in comps}
    series = {
        "off": lambda s: "off",
        "best fixed-s vote": lambda s: best_by_streams[s],
        "vote adaptive": lambda s: "vote adaptive",
        "minions (vote + adaptive + pipeline)": lambda s: "minions",
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, pick in series.items():
        points = [next((r for r in rows if r["streams"] == s and r["mode"] == pick(s)), None) for s in streams]
        xs = [s for s, p in zip(streams, points) if p]
        axes[0].plot(xs, [p["tokens_per_s"] for p in points if p], marker="o", label=label)
        axes[1].plot(xs, [p["normalized_latency_ms"] for p in points if p], marker="o", label=label)
    for ax, ylabel in zip(axes, ("output tokens/s", "normalised latency, ms per token")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(s) for s in streams])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Minions load sweep ({deployment}), greedy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--streams", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    p.add_argument("--min-requests", type=int, default=4, help="requests per cell at low concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--modes", nargs="+", help="labels from: " + ", ".join(m.label for m in default_modes())
                   + f"; or single:<ssm> (that SSM alone, adaptive length, the deployment's pipeline: the "
                   f"default with one drafter); or {DEPLOYED.label} (what a request "
                   "that names no speculation gets: the deployment's default mode, length and pipeline)")
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS | COPY_HEAVY),
                   help="prompts from these only (default: the chat sets, mixed: datasets/README.md)")
    p.add_argument("--out", default=str(ROOT / "bench_results" / "load"))
    p.add_argument("--repeat", type=int, default=1, help="passes over the modes at each concurrency; the tables "
                   "show medians and ranges (a cell at 8-16 streams swings by 10%% between runs)")
    return p


def main() -> None:
    args = parser().parse_args()
    require(args.datasets or chat_sets())  # a missing set: one line, before anything starts
    modes = [m for m in default_modes() if not args.modes or m.label in args.modes or m.label == "off"]
    modes += [LoadMode(label, label, None, None) for label in args.modes or () if label.startswith("single:")]
    modes += [DEPLOYED] if DEPLOYED.label in (args.modes or ()) else []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    prompts = cell_prompts(args.streams, args.min_requests, args.repeat, args.datasets)
    warm = warm_up_prompts(2)
    for mode in modes:
        log = out / f"tritonserver-{re.sub(r'[^a-z0-9]+', '-', mode.label.lower())}.log"
        with TritonProcess(args.deploy, log_path=log) as server:
            run_cell(server.grpc_url, server.metrics_url, mode, 2, warm, 16)  # first calls pay one-off costs
            for streams in args.streams:
                for repeat in range(args.repeat):
                    cell = run_cell(server.grpc_url, server.metrics_url, mode, streams, prompts[streams, repeat],
                                    args.max_tokens, repeat)
                    cells.append(cell)
                    r = cell.row()
                    print(f"{mode.label:<14} {streams:>3} streams {r['tokens_per_s']:6.1f} tok/s  "
                          f"batch {r['llm_batch'] or 0:.1f}  mean s {r['mean_draft_length']:.1f}", flush=True)
    cell_rows = summarize(cells)
    rows = pool_repeats(cell_rows)
    comps = comparisons(rows, cell_rows)
    text = format_tables(rows, comps)
    print(text)
    (out / "load_sweep.md").write_text(text + "\n")
    (out / "load_sweep.json").write_text(json.dumps({"rows": rows, "comparisons": comps, "cells": cell_rows}, indent=1))
    plot(rows, comps, out / "load_sweep.png", Path(args.deploy).name)
    print(f"\nwrote {out / 'load_sweep.md'}, load_sweep.json and load_sweep.png")


if __name__ == "__main__":
    exit_on_missing_set(main)
