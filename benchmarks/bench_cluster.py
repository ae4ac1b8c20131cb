"""`make bench-cluster`: one replica direct, N replicas behind the gateway with prefix affinity, and N
round-robin, on the multi-turn workloads (benchmarks/peers/conversations.py: MT-bench chat with a third
turn, whole-file code edits), each configuration on freshly started replicas.

Printed per workload and configuration: output tokens/s, TTFT p50/p99, the prompt tokens the replicas
found cached and those they computed, the later turns kept on the replica of the turn before, and the
requests each replica answered (which one: the answer's id in its own log). Replicas on one host share
its cores: throughput scaling holds only with a core per replica (`--pin`); hit rate, prefill and spread
hold anywhere.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from client.api import GenerationParams, generate_openai
from loadtest.summary import percentiles
from minions.deploy.cluster import Cluster
from minions.deploy.server import ServerPorts, free_ports
from minions.text.datasets import exit_on_missing_set, require

from .peers.conversations import FOLLOW_UPS, WORKLOADS, ConversationCell, conversations, run_conversations
from .peers.streams import Sample

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("one replica", "affinity", "round-robin")
RESPONSE_TIMEOUT_S = 600.0


def converse(url: str, max_tokens: int, answered: dict[int, str]):
    """A conversation's turn through the OpenAI API at `url`; `answered` maps each sample to its answer's id."""
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)

    def turn(messages: list[dict]) -> Sample:
        c = generate_openai(url, "minions", messages, params, timeout_s=RESPONSE_TIMEOUT_S)
        sample = Sample(c.text, c.num_output_tokens, c.ttft_s or c.latency_s, c.latency_s, c.num_input_tokens or 0,
                        c.num_cached_tokens or 0)
        answered[id(sample)] = c.response_id
        return sample
    return turn


def summary(config: str, cell: ConversationCell, served: dict[str, int], answered: dict[int, str],
            replicas: int) -> dict:
    """One configuration's figures on one workload."""
    samples = cell.samples
    replica = {key: served.get(answered[id(s)]) for key, s in samples.items()}
    later = [(c, t) for c, t in samples if t > 0]
    kept = sum(replica[c, t] == replica[c, t - 1] for c, t in later if (c, t - 1) in replica)
    prompt = sum(s.prompt_tokens for s in samples.values())
    cached = sum(s.cached_tokens for s in samples.values())
    ttft = percentiles([1000 * s.ttft_s for s in samples.values()])
    spread = [sum(r == i for r in replica.values()) for i in range(replicas)]
    return {"config": config, "workload": cell.workload, "requests": len(samples), "errors": len(cell.errors),
            "tokens_per_s": sum(s.tokens for s in samples.values()) / cell.wall_s,
            "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"], "hit_rate": cached / prompt if prompt else 0.0,
            "prefill_tokens": prompt - cached, "kept": kept / len(later) if later else 1.0, "spread": spread}


def run_config(config: str, args: argparse.Namespace, workloads: dict[str, list[list[str]]], out: Path) -> list[dict]:
    replicas = 1 if config == "one replica" else args.replicas
    ports = free_ports(4 * replicas + 2)
    cluster = Cluster(Path(args.deploy), [ServerPorts("127.0.0.1", *ports[4 * i:4 * i + 4]) for i in range(replicas)],
                      ports[-2], out / "build", affinity=config != "round-robin", pin=args.pin,
                      log_dir=out / "logs" / config.replace(" ", "-"), gateway_metrics_port=ports[-1])
    rows = []
    with cluster:
        url = f"{cluster.workers[0]}/v1" if config == "one replica" else cluster.url
        for workload, users in workloads.items():
            answered: dict[int, str] = {}
            cell = run_conversations(config, workload, converse(url, args.max_tokens, answered), users, args.streams)
            rows.append(summary(config, cell, cluster.served_by(), answered, replicas))
            print(format_row(rows[-1]), flush=True)
    return rows


HEADER = ("| workload | configuration | requests | tok/s | TTFT p50 ms | TTFT p99 ms | prompt cached | prefill tokens "
          "| later turns kept | requests per replica |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|")


def format_row(r: dict) -> str:
    return (f"| {r['workload']} | {r['config']} | {r['requests']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | "
            f"{r['ttft_p99_ms']:.0f} | {r['hit_rate']:.0%} | {r['prefill_tokens']} | {r['kept']:.0%} | "
            f"{'/'.join(map(str, r['spread']))} |" + (f" {r['errors']} errors" if r["errors"] else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--streams", type=int, default=6, help="conversations at once")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--offset", type=int, default=60, help="first row of each prompt set (past other benchmarks')")
    p.add_argument("--pin", action="store_true", help="each replica on cores of its own (taskset)")
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--out", default=str(ROOT / "bench_results" / "cluster"))
    args = p.parse_args()
    require(FOLLOW_UPS[w][0] for w in args.workloads)
    workloads = {w: conversations(w, args.conversations, args.offset) for w in args.workloads}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(HEADER, flush=True)
    start = time.monotonic()
    rows = [row for config in args.configs for row in run_config(config, args, workloads, out)]
    (out / "bench_cluster.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(f"\n{len(rows)} cells in {time.monotonic() - start:.0f} s; wrote {out / 'bench_cluster.json'}")


if __name__ == "__main__":
    exit_on_missing_set(main)
