"""What the default did beside `off`, per cell of a `make bench-paired` run: its decode time against
`off`'s, and the work that may explain the difference.

Reads the run's paired.json (each pair's decode time as the client saw it) and its tritonserver.log (the
orchestrator's line per request: LLM calls, drafting seconds, acceptance), pairs them in order
(bench_paired sends one request at a time, in order: warm-ups, then each pair, a conversation's earlier
turns before its pair, a control after it), and
prints per cell the total decode time ratio, the default's extra LLM calls per request (a plain stream
stopped for a probe's draft), the draft tokens it verified and rejected or accepted, and its drafting
time on the request's path. Usage: python -m benchmarks.paired_breakdown bench_results/paired
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

LINE = re.compile(r": success, (?P<mode>\S+), (?P<tokens>\d+) tokens in [\d.]+ s; \d+ prompt tokens \(\d+ cached\), "
                  r"[\d.]+ tok/s \(drafting (?P<draft_s>-?[\d.]+) s, verifying [\d.]+ s, control [\d.]+ s\), "
                  r"(?P<rounds>\d+) rounds, (?P<calls>\d+) LLM calls, acceptance (?P<acceptance>[\d.]+)")


WARM_UP_REQUESTS = 4
"""bench_paired's two warm-up pairs, first in the log."""
LAST_TURN = ", last turn"
EARLIER_TURNS = 2
"""The multi-turn workloads' turns before the paired last one (peers/conversations.py: three turns each)."""


def requests(log: str) -> list[dict]:
    return [{k: (v if k == "mode" else float(v)) for k, v in m.groupdict().items()} for m in LINE.finditer(log)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a bench_paired --out folder")
    args = p.parse_args()
    run = json.loads((args.run / "paired.json").read_text())
    lines = iter(requests((args.run / "tritonserver.log").read_text(errors="replace"))[WARM_UP_REQUESTS:])
    rows = []
    for cell in run["outputs"]:
        for pair in cell["pairs"]:
            for _ in range(EARLIER_TURNS if cell["workload"].endswith(LAST_TURN) else 0):
                next(lines)  # a conversation's earlier turns, the default's alone
            default, other = next(lines), next(lines)
            if pair.get("control"):
                next(lines)
            drafted = pair["default"]["drafted"]
            accepted = drafted * default["acceptance"]
            rows.append({"cell": cell["workload"], "extra_ms": 1000 * (pair["default"]["decode_s"] - pair["other"]["decode_s"]),
                         "default_s": pair["default"]["decode_s"], "off_s": pair["other"]["decode_s"],
                         "calls": default["calls"] - other["calls"], "rejected": drafted - accepted,
                         "accepted": accepted, "draft_s": default["draft_s"]})
    print("| cell | default / `off` decode time | extra ms a request | extra LLM calls | rejected tokens | "
          "accepted tokens | drafting s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for cell in dict.fromkeys(r["cell"] for r in rows):
        group = [r for r in rows if r["cell"] == cell]
        mean = {k: sum(r[k] for r in group) / len(group)
                for k in ("extra_ms", "calls", "rejected", "accepted", "draft_s")}
        ratio = sum(r["default_s"] for r in group) / sum(r["off_s"] for r in group)
        print(f"| {cell} | {ratio:.3f} | {mean['extra_ms']:.0f} | {mean['calls']:.1f} | {mean['rejected']:.1f} | "
              f"{mean['accepted']:.1f} | {mean['draft_s']:.2f} |")

if __name__ == "__main__":
    main()
