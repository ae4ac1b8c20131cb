"""`make bench-paired`: the default against `off` on one server, prompt by prompt (peers/paired.py).

Starts the real tritonserver with the deployment once, and sends every prompt twice, greedy, chat
template, streamed over gRPC: with the deployment's default speculation, then as `off` (for a
multi-turn workload: every turn with the default, the last one again as `off`). Per workload: the
median over prompts of `off`'s decode time per token over the default's, with a bootstrap 90%
interval, the time ratio, the draft tokens the default verified per request, and how many outputs
are equal. Two runs put a cell's median within about 3% of each other, where bench_peers' two
servers taking turns spread a cell by 5-10% (issue 27 asks the default at least 0.97x `off`).
Against llama-server, and for time to first token, use bench_peers. `--against MODE` pairs the
default with another mode than `off` (the default against its single drafters, say), except a mode
drafting with an SSM that learns from finished requests (suffix matching): it would find the
default's answer to the prompt. Where the default drafts with no such SSM either, every other pair
sends the other mode first (peers/paired.ask_pair). `--streams N` sends N prompts at a time, each
mode's requests of a group together (the default's cost at that load, on the same prompts as `off`),
after a one-token `off` request on each has put every prompt in the prefix cache.
Writes paired.md and paired.json under bench_results/paired.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from client.api import GenerationParams, generate_grpc
from minions.deploy.config import Deployment, load_deployment
from minions.errors import InvalidRequest
from minions.settings import EngineKind, OrchestratorSettings
from minions.speculation.mode import Speculation
from minions.text.datasets import (COPY_HEAVY, DEFAULT_COPY_HEAVY, category_prompts, exit_on_missing_set,
                                   require, warm_up_prompts)
from harness.triton_process import ROOT, TritonProcess

from .bench_load import RESPONSE_TIMEOUT_S
from .bench_peers import CATEGORIES, CATEGORIES_FROM, MULTI_TURN_FROM, TEMPLATED, workload_prompts, workload_sets
from .peers.conversations import WORKLOADS as MULTI_TURN
from .peers.conversations import conversations, messages_text
from .peers.paired import (Answer, Ask, PairedCell, ask_pair, concurrently, converse_group, format_rows,
                           one_by_one)

WORKLOADS = (CATEGORIES, *COPY_HEAVY, TEMPLATED, *MULTI_TURN)


def grpc_ask(url: str, model: str, max_tokens: int) -> Ask:
    """Ask over gRPC streaming, greedy, with the perf outputs (the draft tokens verified)."""
    def ask(messages: list[dict], speculation: str | None) -> Answer:
        params = GenerationParams(max_tokens=max_tokens, temperature=0.0, chat=True, speculation=speculation,
                                  return_perf_metrics=True)
        c = generate_grpc(url, model, messages_text(messages), params, stream=True, timeout_s=RESPONSE_TIMEOUT_S)
        return Answer(c.text, c.num_output_tokens, c.latency_s - (c.ttft_s or c.latency_s), c.total_draft_tokens or 0)
    return ask


def single_turn(workload: str, prompts: int) -> dict[str, list[str]]:
    """The prompts of a single-turn workload, by cell name (one per category for `categories`)."""
    if workload == CATEGORIES:
        return category_prompts(prompts, CATEGORIES_FROM)
    return {workload: workload_prompts(workload, [prompts])[0]}


def learning_ssms(dep: Deployment, mode: str) -> list[str]:
    """The SSMs a speculation mode drafts with that learn from finished requests (InvalidRequest for an
    unknown mode or SSM)."""
    names = tuple(ssm["name"] for ssm in dep.ssms)
    used = Speculation.parse(mode, names).ssms
    return [ssm["name"] for ssm in dep.ssms if ssm["name"] in used and ssm.get("engine") == EngineKind.SUFFIX]


class UnknownCell(ValueError):
    """A --cells name that none of the run's workloads has."""


def run(workloads: list[str], ask: Ask, prompts: int, conversation_count: int, against: str,
        alternate: bool, control: bool = False, only: frozenset[str] = frozenset(),
        streams: int = 1, prime: Ask | None = None) -> list[PairedCell]:
    """Every workload's cells (those named in `only`, where given), each printed as it ends; with
    `alternate`, every other group of pairs asks the other mode first, with `control` the other mode
    once more after each pair (peers/paired.ask_pair); `streams` prompts at a time, each mode's
    requests of a group sent together after `prime` (a one-token ask) asked them all (peers/paired.converse_group)."""
    talks: dict[str, list[list[str]]] = {}
    for workload in workloads:
        if workload in MULTI_TURN:
            talks[f"{workload}, last turn"] = conversations(workload, conversation_count, MULTI_TURN_FROM)
        else:
            talks |= {name: [[t] for t in texts] for name, texts in single_turn(workload, prompts).items()}
    if unknown := only - talks.keys():
        raise UnknownCell(f"no cell named {', '.join(sorted(unknown))}; the workloads' cells: {', '.join(talks)}")
    together = concurrently(ask) if streams > 1 else one_by_one(ask)
    primed = concurrently(prime) if streams > 1 and prime is not None else None
    cells = []
    for name, turn_lists in talks.items():
        if only and name not in only:
            continue
        groups = [turn_lists[i:i + streams] for i in range(0, len(turn_lists), streams)]
        cells.append(PairedCell(name, [pair for g, talks in enumerate(groups) for pair in
                                       converse_group(together, talks, against, alternate and g % 2 == 1, control,
                                                      primed)]))
        print(format_rows([cells[-1].row()], against).splitlines()[-1], flush=True)
    return cells


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS,
                   default=[CATEGORIES, *DEFAULT_COPY_HEAVY, TEMPLATED, "multi_turn_code"])
    p.add_argument("--prompts", type=int, default=10, help="prompts per workload, and per category")
    p.add_argument("--conversations", type=int, default=8, help="conversations per multi-turn workload")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--against", default="off", help="the mode each default request is paired with")
    p.add_argument("--control", action="store_true",
                   help="ask the other mode once more after each pair: the time ratio two identical requests "
                        "read, each cell's noise floor beside its default / other ratio")
    p.add_argument("--cells", nargs="+", default=[],
                   help="only these cells (e.g. mt_bench/coding, passages, 'multi_turn_code, last turn'): a run's "
                        "doubtful cells again")
    p.add_argument("--streams", type=int, default=1,
                   help="prompts at a time: each mode's requests of a group sent together (the default's "
                        "cost at that load; a cell's prompts a multiple of it)")
    p.add_argument("--out", default=str(ROOT / "bench_results" / "paired"))
    return p


def main() -> None:
    p = parser()
    args = p.parse_args()
    require(n for w in args.workloads for n in workload_sets(w))  # a missing set: one line, before the server
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dep = load_deployment(args.deploy)
    orchestrator = OrchestratorSettings.from_yaml(dep.orchestrator)
    try:
        learning = learning_ssms(dep, args.against)
    except InvalidRequest as exc:
        p.error(str(exc))
    if learning:
        p.error(f"--against {args.against}: {', '.join(learning)} learns from finished requests and would find "
                "the default's answer to each prompt")
    with TritonProcess(args.deploy, log_path=out / "tritonserver.log") as triton:
        ask = grpc_ask(triton.grpc_url, orchestrator.model_name, args.max_tokens)
        for prompt in warm_up_prompts(2):  # first calls pay one-off costs
            ask_pair(ask, [{"role": "user", "content": prompt}], args.against)
        alternate = not learning_ssms(dep, orchestrator.default_speculation)
        try:
            cells = run(args.workloads, ask, args.prompts, args.conversations, args.against, alternate, args.control,
                        frozenset(args.cells), max(args.streams, 1),
                        grpc_ask(triton.grpc_url, orchestrator.model_name, 1))
        except UnknownCell as exc:  # raised before any request
            p.error(str(exc))
    rows = [c.row() for c in cells]
    at_once = f", {args.streams} prompts at a time" if args.streams > 1 else ""
    text = (f"Default ({orchestrator.default_speculation}) against `{args.against}` on one server, prompt by "
            f"prompt ({dep.path.name}, greedy, {args.max_tokens} tokens{at_once}; decode time per token):\n\n"
            + format_rows(rows, args.against))
    print("\n" + text)
    (out / "paired.md").write_text(text + "\n")
    outputs = [{"workload": c.workload, "pairs": [asdict(p) for p in c.pairs]} for c in cells]
    (out / "paired.json").write_text(json.dumps({"deploy": str(dep.path), "against": args.against,
                                                 "max_tokens": args.max_tokens, "rows": rows, "outputs": outputs},
                                                indent=1))
    print(f"\nwrote {out / 'paired.md'} and paired.json")


if __name__ == "__main__":
    exit_on_missing_set(main)
