"""Minions against llama-server through their OpenAI APIs, loaded by the same Locust user.

Where `make bench-peers` drives each server with its own client, this runs `python -m loadtest.run
--protocols openai` (loadtest/locustfile.py's OpenAIStreamUser: closed-loop users streaming chat
completions from the chat prompt sets) against each system in turn: llama-server plain on the GGUF the
deployment computes with, Minions `off` and Minions' default, each on a fresh server (so that no system
finds a cell's prompts in a cache filled by another cell), at each user count; with `--repeats n` the
systems run n times per user count, in alternating order (ABC, CBA, ...), and a row is the mean of a
system's runs with the spread of their tokens/s (one run per system read ±5% between two servers of
the same code path at one user, as the machine drifts). Prints, per cell, output
tokens/s, TTFT p50/p99, ITL p50 and requests, and Minions' ratios to llama-server's: throughput over
llama-server's, TTFT over llama-server's; `others`, the CPU cores processes outside the benchmark used
meanwhile (read a cell only where it is near 0). Locust runs on the same cores as the server under test,
for every system alike. Writes peers_openai.md/.json and each run's Locust files under --out.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

from loadtest.run import main as loadtest
from minions.deploy.config import load_deployment
from minions.settings import OrchestratorSettings
from harness.openai_frontend import openai_frontend
from harness.triton_process import ROOT, TritonProcess

from .peers import ggufs
from .peers.foreign_cpu import ForeignCpu
from .peers.llama_server import LlamaServer, ServerConfig
from .peers.llama_server_build import llama_server

LLAMA = "llama-server"
SYSTEMS = (LLAMA, "minions-off", "minions-default")


@contextmanager
def minions_openai(deploy: str, log_dir: Path, label: str):
    """tritonserver with the deployment and the OpenAI frontend beside it, as `make serve` runs them:
    the frontend's /v1 URL, the model's name and tritonserver's pid."""
    with TritonProcess(deploy, log_path=log_dir / f"tritonserver-{label}.log") as triton:
        model = OrchestratorSettings.from_yaml(load_deployment(deploy).orchestrator).model_name
        with openai_frontend(triton, log_dir / f"frontend-{label}.log", model) as url:
            yield url, model, triton.proc.pid


def run_cell(args: argparse.Namespace, system: str, users: int, out: Path) -> dict:
    """One system at one user count on a fresh server: loadtest.run's summary, with `foreign_cores`, the
    CPU cores processes outside the benchmark used meanwhile (peers/foreign_cpu.py)."""
    cell_out = out / f"{system}-u{users}"
    cell_out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        if system == LLAMA:
            dep = load_deployment(args.deploy)
            max_context = OrchestratorSettings.from_yaml(dep.orchestrator).limits.context
            server = stack.enter_context(LlamaServer(llama_server(), ServerConfig(LLAMA, ggufs.llm_gguf(dep)),
                                                     args.threads, max(args.users), max_context,
                                                     cell_out / "llama-server.log"))
            url, model, speculation, server_pid = f"{server.url}/v1", "unused", "", server.proc.pid
        else:
            url, model, server_pid = stack.enter_context(minions_openai(args.deploy, cell_out, system))
            speculation = "off" if system == "minions-off" else ""
        with ForeignCpu({server_pid}) as foreign:
            loadtest(["--protocols", "openai", "--openai-host", url, "--openai-model", model, "--users", str(users),
                      "--spawn-rate", str(users), "--time", str(args.time), "--max-tokens", str(args.max_tokens),
                      "--speculation", speculation, "--out", str(cell_out)])
    return json.loads((cell_out / "summary.json").read_text()) | {"foreign_cores": foreign.cores}


def row(system: str, users: int, s: dict) -> dict:
    return {"system": system, "users": users, "requests": s["succeeded"], "failed": s["failed"],
            "tok_s": s["output_tokens_per_s"], "ttft_p50": s["ttft_ms"]["p50"], "ttft_p99": s["ttft_ms"]["p99"],
            "itl_p50": s["itl_ms"]["p50"], "others": s.get("foreign_cores")}


def mean_row(runs: list[dict]) -> dict:
    """One system's runs at one user count as one row: the mean of each figure (requests and failures
    summed), and `tok_s_range`, the lowest and highest tokens/s of the runs."""
    mean = dict(runs[0])
    for key in ("tok_s", "ttft_p50", "ttft_p99", "itl_p50", "others"):
        values = [r[key] for r in runs if r[key] is not None]
        mean[key] = sum(values) / len(values) if values else None
    for key in ("requests", "failed"):
        mean[key] = sum(r[key] for r in runs)
    mean["runs"] = len(runs)
    mean["tok_s_range"] = (min(r["tok_s"] for r in runs), max(r["tok_s"] for r in runs))
    return mean


def repeated_cells(args: argparse.Namespace, users: int, out: Path,
                   run: Callable[..., dict] | None = None) -> list[dict]:
    """Every system `args.repeats` times at this user count, in alternating order, each run on a fresh
    server (`run`: `run_cell`'s signature and answer): one mean row per system (a single run's row as it is)."""
    run = run or run_cell
    runs: dict[str, list[dict]] = {system: [] for system in args.systems}
    for repeat in range(args.repeats):
        order = args.systems if repeat % 2 == 0 else args.systems[::-1]
        cell_out = out / f"repeat{repeat + 1}" if args.repeats > 1 else out
        for system in order:
            runs[system].append(row(system, users, run(args, system, users, cell_out)))
    return [mean_row(runs[system]) if args.repeats > 1 else runs[system][0] for system in args.systems]


def with_ratios(rows: list[dict]) -> list[dict]:
    """One load's rows, each system's but llama-server's with its ratios to llama-server's row (in
    whatever order the systems ran; none without a llama-server row)."""
    reference = next((r for r in rows if r["system"] == LLAMA), None)
    for r in rows:
        if reference is not None and r is not reference:
            for key in ("tok_s", "ttft_p50", "ttft_p99"):
                r[f"{key}_ratio"] = r[key] / reference[key] if reference[key] else None
    return rows


def format_rows(rows: list[dict]) -> str:
    def num(v, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    lines = ["| system | users | requests | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | tok/s vs llama | "
             "TTFT p50 vs llama | TTFT p99 vs llama | others |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        spread = (f" ({r['tok_s_range'][0]:.1f}–{r['tok_s_range'][1]:.1f}, {r['runs']} runs)"
                  if r.get("runs", 1) > 1 else "")
        lines.append(f"| {r['system']} | {r['users']} | {r['requests']}{failed} | {num(r['tok_s'], '.1f')}{spread}"
                     f" | {num(r['ttft_p50'], '.0f')} | {num(r['ttft_p99'], '.0f')} | "
                     f"{num(r['itl_p50'], '.1f')} | {num(r.get('tok_s_ratio'), '.2f')} | "
                     f"{num(r.get('ttft_p50_ratio'), '.2f')} | {num(r.get('ttft_p99_ratio'), '.2f')} | "
                     f"{num(r.get('others'), '.2f')} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--users", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--time", type=int, default=40, help="seconds of load per cell")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each system per user count, in alternating order; rows are their means")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-server threads (-t)")
    p.add_argument("--out", default=str(ROOT / "bench_results" / "openai-peers"))
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    out = Path(args.out)
    rows = []
    for users in args.users:
        rows += with_ratios(repeated_cells(args, users, out))
    text = format_rows(rows)
    print(text)
    (out / "peers_openai.md").write_text(text + "\n")
    (out / "peers_openai.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
