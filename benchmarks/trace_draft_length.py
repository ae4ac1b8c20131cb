"""The adaptive selector's trace: the draft length s it chooses, round by round, as the workload changes.

One stream, full Minions (vote + adaptive + pipeline), greedy, on a workload that moves from chat
(MT-bench) to code edits to summarisation (passages: datasets/README.md); edits and summaries copy from
their prompt, so acceptance changes. Writes the trace as JSON and a PNG plot,
and prints per phase the mean s, how often s changed between consecutive non-exploration rounds, and
the acceptance.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from client.api import GenerationParams, generate_grpc
from minions.text.datasets import exit_on_missing_set, load_prompts, require
from harness.triton_process import ROOT, TritonProcess


PHASES = {"chat": "mt_bench", "code_edit": "code_edit", "summarisation": "passages"}
"""Phase -> the prompt set it reads, from PHASE_OFFSET on (past the prompts the load sweep uses)."""
PHASE_OFFSET = 40


def phases(per_phase: int) -> dict[str, list[str]]:
    return {phase: load_prompts(name, per_phase, offset=PHASE_OFFSET) for phase, name in PHASES.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--per-phase", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=str(ROOT / "bench_results" / "trace"))
    args = p.parse_args()
    require(PHASES.values())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace: list[dict] = []
    with TritonProcess(args.deploy, log_path=out / "tritonserver.log") as server:
        for phase, prompts in phases(args.per_phase).items():
            for prompt in prompts:
                c = generate_grpc(server.grpc_url, "minions", prompt, GenerationParams(
                    max_tokens=args.max_tokens, chat=True, speculation="vote", pipeline=True, return_perf_metrics=True))
                trace.append({"phase": phase, "lengths": (c.draft_lengths or [])[1:], "acceptance": c.acceptance_rate,
                              "tokens_per_s": c.tokens_per_s})
    lines = [f"{'phase':<14} {'rounds':>6} {'mean s':>6} {'changes':>7} {'accept':>6} {'tok/s':>6}"]
    for phase in dict.fromkeys(t["phase"] for t in trace):
        rows = [t for t in trace if t["phase"] == phase]
        lengths = [s for t in rows for s in t["lengths"]]
        changes = sum(a != b for t in rows for a, b in zip(t["lengths"], t["lengths"][1:]))
        lines.append(f"{phase:<14} {len(lengths):>6} {statistics.mean(lengths) if lengths else 0:>6.1f} {changes:>7} "
                     f"{statistics.mean(t['acceptance'] or 0 for t in rows):>6.2f} "
                     f"{statistics.mean(t['tokens_per_s'] for t in rows):>6.1f}")
    print("\n".join(lines))
    (out / "trace.md").write_text("\n".join(lines) + "\n")
    (out / "trace.json").write_text(json.dumps(trace, indent=1))
    _plot(trace, out / "draft_length_trace.png")


def _plot(trace: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.5))
    x = 0
    colors = {"chat": "tab:blue", "finance": "tab:orange", "summarisation": "tab:green"}
    for t in trace:
        xs = list(range(x, x + len(t["lengths"])))
        ax.step(xs, t["lengths"], where="post", color=colors.get(t["phase"], "gray"))
        x += len(t["lengths"])
        ax.axvline(x - 0.5, color="lightgray", linewidth=0.6)
    for phase, color in colors.items():
        ax.plot([], [], color=color, label=phase)
    ax.set_xlabel("round (requests one after another; grey lines separate requests)")
    ax.set_ylabel("draft length s")
    ax.set_title("Adaptive draft length, full Minions, one stream: chat -> finance -> summarisation")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    exit_on_missing_set(main)
