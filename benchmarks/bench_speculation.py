"""`make bench`: speculative modes against plain decoding (`off`) through the same server, batch 1.

Starts the real tritonserver with deploy.yaml, replays TOTAL_PROMPTS prompts of the chat sets (MT-bench
by default; MINIONS_CHAT_SETS or --datasets for others: datasets/README.md) one at a time, greedy,
and runs every mode on each prompt back to back so machine noise hits all modes alike. Prints a table per dataset and overall (tokens/s, normalised
latency, TTFT, acceptance, tokens per LLM call, speedup over `off` from the same run, the share of
request time the server spent in control (voting, weight updates, SSM selection), and whether the
output equals `off` token for token), and writes JSON and a PNG chart. By default it runs `off`,
every served SSM alone (`single:<ssm>`), `bandit` and `vote`.

The server runs the deployment with nothing a mode could take from the one before it on the same
prompt (benchmarks/replay.py): no suffix corpus of finished requests (it would hold `off`'s answer,
which every greedy mode repeats) and no llama.cpp prefix caches (the prompt's prefill would be paid
by the first mode alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from client.api import Completion, GenerationParams, generate_grpc
from minions.text.datasets import COPY_HEAVY, DATASETS, chat_sets, exit_on_missing_set, load_prompts, require
from harness.metrics import metric_value
from harness.triton_process import ROOT, TritonProcess

from .replay import replay_deployment

TOTAL_PROMPTS = 20
"""Prompts a run replays unless --prompts-per-dataset says otherwise, shared evenly by the sets."""


@dataclass(frozen=True)
class Mode:
    """`SPECULATION[@K][+dl]`: @K fixes the draft length, +dl sends draft logits (sampled drafts)."""

    label: str
    speculation: str
    k: int | None
    """None: the deployment's default_num_draft_tokens."""
    use_draft_logits: bool = False

    @classmethod
    def parse(cls, text: str) -> "Mode":
        body, dl = (text[:-3], True) if text.endswith("+dl") else (text, False)
        spec, _, k = body.partition("@")
        return cls(text, spec, int(k) if k else None, dl)


@dataclass
class Sample:
    dataset: str
    prompt_index: int
    mode: str
    tokens: int
    latency_s: float
    ttft_s: float
    acceptance: float | None
    tokens_per_llm_call: float | None
    text: str
    accepted_per_llm_call: float | None = None
    control_s: float = 0.0
    """Server time spent voting, updating weights and choosing SSMs (minions_control_seconds)."""


def summarize(samples: list[Sample], baseline: str, compare_text: bool = True) -> list[dict]:
    rows = []
    base = [s for s in samples if s.mode == baseline]
    base_tps = sum(s.tokens for s in base) / max(sum(s.latency_s for s in base), 1e-9)
    base_text = {(s.dataset, s.prompt_index): s.text for s in base}
    for mode in dict.fromkeys(s.mode for s in samples):
        group = [s for s in samples if s.mode == mode]
        tps = sum(s.tokens for s in group) / max(sum(s.latency_s for s in group), 1e-9)
        acc = [s.acceptance for s in group if s.acceptance is not None]
        tpv = [s.tokens_per_llm_call for s in group if s.tokens_per_llm_call]
        apv = [s.accepted_per_llm_call for s in group if s.accepted_per_llm_call is not None]
        rows.append({
            "mode": mode,
            "requests": len(group),
            "tokens": sum(s.tokens for s in group),
            "tokens_per_s": tps,
            "normalized_latency_ms": 1000 * statistics.mean(s.latency_s / max(s.tokens, 1) for s in group),
            "ttft_ms": 1000 * statistics.median(s.ttft_s for s in group),
            "acceptance": statistics.mean(acc) if acc and mode != baseline else None,
            "tokens_per_llm_call": statistics.mean(tpv) if tpv else None,
            "accepted_per_llm_call": statistics.mean(apv) if apv else None,
            "speedup": tps / base_tps if base_tps else None,
            "control_share": sum(s.control_s for s in group) / max(sum(s.latency_s for s in group), 1e-9),
            # sampled outputs legitimately differ from `off`: only greedy runs are compared
            "identical_to_off": sum(base_text.get((s.dataset, s.prompt_index)) == s.text for s in group)
            if compare_text else None,
        })
    return rows


def format_table(title: str, rows: list[dict]) -> str:
    head = (f"{'mode':<22} {'req':>4} {'tok/s':>7} {'ms/tok':>7} {'TTFT ms':>8} {'accept':>7} {'acc/call':>9} {'tok/call':>9} "
            f"{'speedup':>8} {'control':>8} {'same as off':>11}")
    lines = [f"\n## {title}", head, "-" * len(head)]
    for r in rows:
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        tpv = f"{r['tokens_per_llm_call']:.2f}" if r["tokens_per_llm_call"] else "-"
        apv = f"{r['accepted_per_llm_call']:.2f}" if r["accepted_per_llm_call"] is not None else "-"
        lines.append(
            f"{r['mode']:<22} {r['requests']:>4} {r['tokens_per_s']:>7.1f} {r['normalized_latency_ms']:>7.1f} "
            f"{r['ttft_ms']:>8.0f} {acc:>7} {apv:>9} {tpv:>9} {r['speedup']:>7.2f}x {100 * r['control_share']:>7.2f}% "
            + (f"{r['identical_to_off']:>6}/{r['requests']}" if r["identical_to_off"] is not None else f"{'n/a':>11}")
        )
    return "\n".join(lines)


def plot(rows: list[dict], per_dataset: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [r["mode"] for r in rows]
    groups = ["all", *per_dataset]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        values = [next(r["speedup"] for r in (rows if g == "all" else per_dataset[g]) if r["mode"] == mode) for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=mode)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylabel("speedup over off (tokens/s)")
    ax.set_title("Minions, batch 1, greedy, SmolLM2-135M fp32 verifier (CPU)")
    ax.legend(fontsize=8, ncol=len(modes), loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def replay_prompts(datasets: list[str], per_dataset: int | None) -> dict[str, list[str]]:
    """The prompts by set: `per_dataset` of each, or TOTAL_PROMPTS shared by the sets."""
    per_dataset = per_dataset or -(-TOTAL_PROMPTS // len(datasets))
    return {name: load_prompts(name, per_dataset) for name in datasets}


def run(args: argparse.Namespace) -> dict:
    modes = [Mode.parse(m) for m in (args.modes or default_modes(args.deploy))]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = replay_prompts(args.datasets, args.prompts_per_dataset)
    samples: list[Sample] = []
    deploy = replay_deployment(Path(args.deploy), out_dir / "deploy.yaml", prefix_caching=False)
    print(f"{args.deploy} without the suffix corpus and prefix caches: {deploy}", flush=True)
    with TritonProcess(deploy, log_path=out_dir / "tritonserver.log") as server:
        print(f"server ready: gRPC {server.grpc_url}", flush=True)
        for mode in modes:  # warm-up: first calls pay one-off costs (allocations, page faults)
            _complete(server.grpc_url, "Say hello.", mode, 16, args.temperature)
        for name, texts in prompts.items():
            for i, text in enumerate(texts):
                for mode in modes:
                    control_before = control_seconds(server.metrics_url)
                    c = _complete(server.grpc_url, text, mode, args.max_tokens, args.temperature)
                    samples.append(Sample(name, i, mode.label, c.num_output_tokens, c.latency_s, c.ttft_s or c.latency_s,
                                          c.acceptance_rate if mode.speculation != "off" else None,
                                          c.tokens_per_llm_call, c.text,
                                          (c.total_accepted_draft_tokens or 0) / c.num_llm_calls if c.num_llm_calls else None,
                                          control_seconds(server.metrics_url) - control_before))
                    print(f"{name}[{i}] {mode.label:<20} {c.num_output_tokens:>4} tok {c.tokens_per_s:6.1f} tok/s", flush=True)
    baseline = modes[0].label
    greedy = args.temperature == 0
    overall = summarize(samples, baseline, greedy)
    per_dataset = {name: summarize([s for s in samples if s.dataset == name], baseline, greedy) for name in prompts}
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "prompts_per_dataset": len(next(iter(prompts.values()))),
        "overall": overall,
        "per_dataset": per_dataset,
        "samples": [asdict(s) for s in samples],
    }
    for name, rows in per_dataset.items():
        print(format_table(f"{name} ({len(prompts[name])} prompts)", rows))
    decoding = "greedy" if greedy else f"sampled at temperature {args.temperature}, seeded"
    print(format_table(f"all datasets ({len(samples) // len(modes)} prompts, max_tokens {args.max_tokens}, {decoding}, batch 1)", overall))
    (out_dir / "bench_speculation.json").write_text(json.dumps(report, indent=2))
    plot(overall, per_dataset, out_dir / "bench_speculation.png")
    print(f"\nwrote {out_dir / 'bench_speculation.json'} and {out_dir / 'bench_speculation.png'}")
    return report


def default_modes(deploy: str) -> list[str]:
    """`off`, then every SSM the deployment serves alone, then `bandit` and `vote` over all of them."""
    from minions.deploy.config import load_deployment

    return ["off", *(f"single:{s['name']}" for s in load_deployment(deploy).ssms), "bandit", "vote"]


def control_seconds(metrics_url: str) -> float:
    """The server's minions_control_seconds, all modes together (requests here run one at a time)."""
    return metric_value(metrics_url, "minions_control_seconds")


def _complete(url: str, prompt: str, mode: Mode, max_tokens: int, temperature: float) -> Completion:
    params = GenerationParams(max_tokens=max_tokens, temperature=temperature, seed=0, speculation=mode.speculation,
                              num_draft_tokens=mode.k if mode.speculation != "off" else None, chat=True,
                              use_draft_logits=mode.use_draft_logits)
    return generate_grpc(url, "minions", prompt, params, stream=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--datasets", nargs="+", default=None, choices=list(DATASETS | COPY_HEAVY),
                   help="default: the chat sets (datasets/README.md)")
    p.add_argument("--prompts-per-dataset", type=int, default=None,
                   help=f"default: {TOTAL_PROMPTS} prompts in all, shared by the sets")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--modes", nargs="+", default=None,
                   help="first is the baseline; MODE@K fixes the draft length (default: the deployment's); "
                        "MODE@K+dl sends draft logits. Default: off, single:<each SSM>, bandit, vote")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs compared with off)")
    p.add_argument("--out", default=str(ROOT / "bench_results"))
    return p


def main() -> None:
    args = parser().parse_args()
    args.datasets = args.datasets or chat_sets()
    require(args.datasets)
    run(args)


if __name__ == "__main__":
    exit_on_missing_set(main)
