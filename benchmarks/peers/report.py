"""The peer comparison's rows, printed table and PNG, from the measured cells.

Every ratio is taken within one (workload, concurrency) of one run, against the llama-server plain
configuration that was faster over the run, so that machine drift between cells does not enter it. Greedy texts
are compared with Minions `off` prompt by prompt: Minions' other modes must match it exactly
(losslessness), llama-server plain on the same GGUF shows how far two implementations of one model
agree.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .streams import Cell


def summarize(cells: list[Cell], plain: list[str], reference: str) -> tuple[list[dict], dict]:
    """One row per cell, and which of the `plain` systems was faster (`plain_winner`). Each row gets
    `vs_plain`, its tokens/s over that winner's in the same cell (the winner over the whole run, not
    the best of each cell, which would favour whichever plain configuration got lucky there), and
    `same_as_ref`, its outputs identical to the `reference` system's."""
    rows, groups = [], {}
    for cell in cells:
        groups.setdefault((cell.workload, cell.streams), {})[cell.system] = cell
    for group in groups.values():
        ref = group.get(reference)
        for cell in group.values():
            row = cell.row()
            row["same_as_ref"] = (sum(i in ref.samples and ref.samples[i].text == s.text
                                      for i, s in cell.samples.items()) if ref else None)
            rows.append(row)
    winner = plain_winner(rows, plain)
    rate = {(r["workload"], r["streams"]): r["tokens_per_s"] for r in rows if r["system"] == winner["faster"]}
    for row in rows:
        base = rate.get((row["workload"], row["streams"]))
        row["vs_plain"] = row["tokens_per_s"] / base if base else None
    return rows, winner


def plain_winner(rows: list[dict], plain: list[str]) -> dict:
    """Which llama-server plain configuration was faster: the one ahead in more cells (then by mean
    tokens/s), with the cells each won and its mean tokens/s."""
    wins = dict.fromkeys(plain, 0)
    for workload, streams in dict.fromkeys((r["workload"], r["streams"]) for r in rows):
        rates = {r["system"]: r["tokens_per_s"] for r in rows
                 if r["workload"] == workload and r["streams"] == streams and r["system"] in wins}
        if rates:
            wins[max(rates, key=rates.get)] += 1
    means = {name: statistics.mean([r["tokens_per_s"] for r in rows if r["system"] == name] or [0.0]) for name in plain}
    faster = max(plain, key=lambda n: (wins[n], means[n])) if plain else None
    return {"faster": faster, "cells_won": wins, "mean_tokens_per_s": means}


def format_table(rows: list[dict], winner: dict, reference: str) -> str:
    head = (f"{'workload':<13} {'streams':>7} {'system':<26} {'tok/s':>7} {'vs plain':>8} {'TTFT mean':>9} "
            f"{'TTFT p50':>8} {'TTFT p99':>8} {'ITL ms':>7} {'drafted':>7} {'same':>6} {'others':>6}")
    title = (f"## Minions against llama-server (greedy; vs plain = tokens/s over {winner['faster']}, the faster "
             f"llama-server plain configuration, in the same cell; drafted = draft tokens the LLM verified per "
             f"request; same = outputs identical to {reference}; others = CPU cores other processes used meanwhile)")
    if winner["faster"] is None:
        title = (f"## Minions (greedy; no llama-server in this run; drafted = draft tokens the LLM verified per "
                 f"request; same = outputs identical to {reference})")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        ttft_mean, ttft_p50, ttft_p99, itl = (_ms(r.get(key)) for key in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms",
                                                                         "itl_ms"))
        others = f"{r['foreign_cores']:.2f}" if r.get("foreign_cores") is not None else "-"
        ratio = f"{r['vs_plain']:.2f}x" if r["vs_plain"] is not None else "-"
        same = f"{r['same_as_ref']}/{r['requests']}" if r["same_as_ref"] is not None else "-"
        drafted = f"{r['drafted_per_request']:.1f}" if r.get("drafted_per_request") is not None else "-"
        lines.append(f"{r['workload']:<13} {r['streams']:>7} {r['system']:<26} {r['tokens_per_s']:>7.1f} {ratio:>8} "
                     f"{ttft_mean:>9} {ttft_p50:>8} {ttft_p99:>8} {itl:>7} {drafted:>7} {same:>6} {others:>6}"
                     + (f"  ({r['errors']} errors)" if r["errors"] else ""))
    wins = ", ".join(f"{name} won {n} cells at {winner['mean_tokens_per_s'][name]:.1f} tok/s mean"
                     for name, n in winner["cells_won"].items())
    if winner["faster"] is not None:
        lines += ["", f"Faster llama-server plain configuration: {winner['faster']} ({wins})"]
    return "\n".join(lines)


def format_drafters(rows: list[dict], default: str, single_prefix: str) -> str:
    """Per cell, the default mode's tokens/s over its best single drafter's (each on its own server):
    issue 27 asks the vote to be at least as fast as any of its members."""
    head = (f"{'workload':<13} {'streams':>7} {'default tok/s':>13} {'best single drafter':<28} {'tok/s':>7} "
            f"{'ratio':>6}")
    lines = [f"## {default} against its best single drafter (same cell)", head, "-" * len(head)]
    for workload, streams in dict.fromkeys((r["workload"], r["streams"]) for r in rows):
        cell = [r for r in rows if r["workload"] == workload and r["streams"] == streams]
        mine = next((r for r in cell if r["system"] == default), None)
        singles = [r for r in cell if r["system"].startswith(single_prefix)]
        if mine is None or not singles:
            continue
        best = max(singles, key=lambda r: r["tokens_per_s"])
        ratio = mine["tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] else None
        lines.append(f"{workload:<13} {streams:>7} {mine['tokens_per_s']:>13.1f} "
                     f"{best['system'].removeprefix(single_prefix):<28} {best['tokens_per_s']:>7.1f} "
                     f"{f'{ratio:.2f}x' if ratio is not None else '-':>6}")
    return "\n".join(lines)


def format_anchors(rows: list[dict], default: str, off: str, anchors: dict[str, str]) -> str:
    """Per cell, Minions' default and `off` beside llama-server built from each anchor (`anchors`: anchor
    name -> its system's label; peers/llama_server_build.py), tokens/s, and the ratios that read them:
    `off` over the patched build (what the serving layer adds or costs, the kernels being the same),
    the default over the pinned build (what a user gains over the llama-server they would run) and
    over the newest."""
    names = list(anchors)
    ratios = [(off, "patched"), (default, "pinned"), (default, "newest")]
    ratios = [(system, anchor) for system, anchor in ratios if anchor in anchors]
    head = ["workload", "streams", default, off, *(f"llama-server {a}" for a in names),
            *(f"{'off' if system == off else 'default'} / {anchor}" for system, anchor in ratios)]
    lines = ["## Minions against three llama-server anchors (tokens/s, same cell)", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for workload, streams in dict.fromkeys((r["workload"], r["streams"]) for r in rows):
        rate = {r["system"]: r["tokens_per_s"] for r in rows if r["workload"] == workload and r["streams"] == streams}
        cells = [rate.get(default), rate.get(off), *(rate.get(anchors[a]) for a in names)]
        quotients = [rate.get(system) / rate[anchors[anchor]] if rate.get(system) and rate.get(anchors[anchor])
                     else None for system, anchor in ratios]
        lines.append(f"| {workload} | {streams} | " + " | ".join(f"{x:.1f}" if x else "-" for x in cells) + " | "
                     + " | ".join(f"{q:.2f}x" if q else "-" for q in quotients) + " |")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Tokens/s and ITL against concurrency, one column per workload, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    streams = sorted({r["streams"] for r in rows})
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.6 * len(workloads), 7.5), squeeze=False)
    for col, workload in enumerate(workloads):
        for system in systems:
            points = sorted((r["streams"], r) for r in rows if r["workload"] == workload and r["system"] == system)
            xs = [s for s, _ in points]
            axes[0][col].plot(xs, [r["tokens_per_s"] for _, r in points], marker="o", label=system)
            axes[1][col].plot(xs, [r["itl_ms"] for _, r in points], marker="o", label=system)
        axes[0][col].set_title(workload)
        for ax, ylabel in zip((axes[0][col], axes[1][col]), ("output tokens/s", "inter-token latency, ms")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(streams, [str(s) for s in streams])
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
