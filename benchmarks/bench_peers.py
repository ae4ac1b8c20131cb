"""`make bench-peers`: Minions against llama.cpp's own llama-server on the same GGUF, in one run.

Starts the real tritonserver with the deployment (one per Minions mode: `off`, the default, and each
SSM alone, whose table shows the default against its best single drafter) and
llama-server (built once from the llama.cpp that the pinned llama-cpp-python vendors:
peers/llama_server_build.py) in several configurations: plain on the LLM's GGUF as shipped and as
the deployment computes with it, and its two speculative modes (a draft model, the deployment's
llama.cpp SSM; n-gram cache). Two more anchors run plain on the deployment's GGUF: llama-server
built from the same source with Minions' patches and the deployment's KV cache types (`off` against
it is what the serving layer adds or costs, the kernels being the same) and from the newest llama.cpp
on the registry; their table sets all three beside Minions. Per workload (mixed chat sets, code editing, summarisation, one
template filled with different records: peers/templated.py; on request, one cell per category of
chat prompts) and concurrency, every system in turn
streams the same held-out prompts, greedy, chat template, 96 output tokens at most (EOS ends
earlier, for all alike). Per cell: output tokens/s over the cell's wall time, TTFT (mean, p50), ITL,
tokens/s over the plain llama-server configuration that was faster over the run (in the same cell),
how many outputs are identical to Minions `off`, and the CPU other processes took meanwhile. The
multi-turn workloads (peers/conversations.py) re-send each conversation's history every turn and
report TTFT p50/p99 per turn against llama-server's (plain, the LLM's GGUF as the deployment
computes with it). Writes tables, JSON (with every output) and PNG under bench_results/peers.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from client.api import GenerationParams, generate_grpc
from minions.deploy.config import Deployment, load_deployment
from minions.settings import EngineSettings, OrchestratorSettings
from minions.text.datasets import (CHAT_SETS_VAR, COPY_HEAVY, DEFAULT_COPY_HEAVY, MissingPromptSet, category_prompts,
                                   chat_sets, exit_on_missing_set, load_prompts, mixed_prompts, require,
                                   warm_up_prompts)
from harness.metrics import metric_value
from harness.triton_process import ROOT, TritonProcess

from .bench_load import RESPONSE_TIMEOUT_S
from .peers import ggufs
from .peers.foreign_cpu import ForeignCpu
from .peers.conversations import FOLLOW_UPS, WORKLOADS as MULTI_TURN
from .peers.conversations import (ConversationCell, Converse, conversations, format_turns, messages_text,
                                  run_conversations)
from .peers.llama_server import LlamaServer, ServerConfig, chat_completion, conversation_turn
from .peers.llama_server_build import llama_server, pinned_version
from .peers.report import format_anchors, format_drafters, format_table, plot, summarize
from .peers.templated import templated_prompts
from .peers.streams import Cell, Request, Sample, run_cell

TEMPLATED = "templated"
CATEGORIES = "categories"
"""One cell per category of chat prompts (minions.text.datasets.category_prompts): where `chat` mixes
them, this shows a category where speculation loses. It takes MT-bench's questions whatever their
row, so it runs without `chat` and `multi_turn_chat`."""
CATEGORIES_FROM = 500
"""The other chat sets' category cells start at this row, far past the `chat` cells' blocks."""
WORKLOADS = ("chat", *COPY_HEAVY, TEMPLATED, CATEGORIES, *MULTI_TURN)
DEFAULT_WORKLOADS = ("chat", *DEFAULT_COPY_HEAVY, TEMPLATED, *MULTI_TURN)
"""Every workload but CATEGORIES and the copy-heavy sets that do not ship (datasets/README.md)."""
HELD_OUT = 8
"""Prompts before this index of each set warm or drive other benchmarks and tests (bench_load,
test_load, the greedy-equality test); each concurrency here takes its own block after it, so no
server has seen a cell's prompts before (llama-server reuses a cached prompt's KV across requests)."""
MULTI_TURN_FROM = 56
"""The multi-turn workloads' conversations start at this row of their sets (MT-bench has 80), past
the blocks the single-turn cells take at the default counts (8 + 3 x 16 rows of MT-bench where it is
the only chat set, as it is by default)."""
SPEC_DRAFT_N_MAX = 8
MINIONS_OFF = "minions off"
DRAFTED_METRIC = "minions_spec_decode_num_draft_tokens"
"""Draft tokens a Minions server sent its LLM to verify (every SSM's together): Cell.drafted_tokens."""
SYSTEM_KEYS = ("minions-off", "minions-default", "minions-single", "plain", "patched", "newest", "draft", "ngram")
"""`minions-single`: a Minions server per SSM of the deployment, drafting with that SSM alone; `patched`
and `newest`: llama-server plain on the deployment's GGUF built from those anchors (`ANCHOR_KEYS`)."""
ANCHOR_KEYS = ("patched", "newest")
"""The llama-server anchors besides the pinned one (peers/llama_server_build.py): built from the patched
source (what Minions' serving adds or costs over the same kernels) and from the newest llama.cpp."""
SINGLE = "minions single:"
"""The label prefix of the single-drafter systems (the default's comparison, peers/report.py)."""


def workload_sets(workload: str) -> list[str]:
    """The prompt sets a workload reads (none: the template's records are generated)."""
    if workload == "chat":
        return chat_sets()
    if workload == CATEGORIES:
        return ["mt_bench", *chat_sets()]
    if workload in MULTI_TURN:
        return [FOLLOW_UPS[workload][0]]
    return [] if workload == TEMPLATED else [workload]


def workload_prompts(workload: str, counts: list[int]) -> list[list[str]]:
    """The prompt lists of consecutive cells of a workload, each `count` prompts long and made of the
    next unused prompts of each set after the held-out start."""
    cells, offset = [], HELD_OUT
    for count in counts:
        if workload == "chat":
            cells.append(mixed_prompts(count, offset=offset))
            offset += -(-count // len(chat_sets()))
        elif workload == TEMPLATED:
            cells.append(templated_prompts(count, offset))
            offset += count
        else:
            cells.append(load_prompts(workload, count, offset))
            offset += count
    return cells


def minions_request(url: str, model: str, speculation: str | None, max_tokens: int) -> Request:
    """Minions over gRPC streaming; speculation None sends no speculation (the deployment's default)."""
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, chat=True, speculation=speculation)

    def request(prompt: str) -> Sample:
        c = generate_grpc(url, model, prompt, params, stream=True, timeout_s=RESPONSE_TIMEOUT_S)
        return Sample(c.text, c.num_output_tokens, c.ttft_s or c.latency_s, c.latency_s, c.num_input_tokens or 0,
                      c.num_cached_tokens or 0)
    return request


def minions_converse(url: str, model: str, speculation: str | None, max_tokens: int) -> Converse:
    """A conversation's turn over gRPC streaming: the messages as the `chat` input's JSON list."""
    request = minions_request(url, model, speculation, max_tokens)
    return lambda messages: request(messages_text(messages))


def llama_request(url: str, max_tokens: int) -> Request:
    return lambda prompt: chat_completion(url, prompt, max_tokens, RESPONSE_TIMEOUT_S)


def llama_converse(url: str, max_tokens: int) -> Converse:
    return lambda messages: conversation_turn(url, messages, max_tokens, RESPONSE_TIMEOUT_S)


def server_configs(dep: Deployment, keys: list[str]) -> tuple[list[ServerConfig], list[str]]:
    """The llama-server configurations to run and the labels of the plain ones. Plain: the LLM's GGUF
    as shipped and as the deployment computes with it (when re-encoded). The speculative ones run the
    deployment's own file as the target."""
    target = ggufs.llm_gguf(dep)
    plain_files = dict.fromkeys([ggufs.shipped_gguf(dep), target]) if "plain" in keys else {}
    configs = [ServerConfig(f"llama-server {ggufs.file_type(f)}", f) for f in plain_files]
    if "draft" in keys:
        draft = ggufs.draft_gguf(dep)
        configs.append(ServerConfig("llama-server draft-simple", target, (
            "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(SPEC_DRAFT_N_MAX))))
    if "ngram" in keys:
        configs.append(ServerConfig("llama-server ngram-cache", target, ("--spec-type", "ngram-cache")))
    configs += [ServerConfig(anchor_label(anchor, dep), target, deployment_kv_flags(dep) if anchor == "patched" else (),
                             anchor=anchor) for anchor in ANCHOR_KEYS if anchor in keys]
    return configs, [c.label for c in configs[:len(plain_files)]]


def deployment_kv_flags(dep: Deployment) -> tuple[str, ...]:
    """llama-server's flags for the KV cache the deployment's LLM computes with: a batch-invariant engine
    keeps K in Q8_0 beside an F16 V with flash attention (engines/llamacpp_setup.py), where the patched
    kernels run. The patched anchor takes them, so that it computes as Minions does."""
    if not EngineSettings.from_yaml(dep.llm).batch_invariant:
        return ()
    return ("-fa", "on", "-ctk", "q8_0", "-ctv", "f16")


def anchor_label(anchor: str, dep: Deployment) -> str:
    """llama-server plain on the deployment's GGUF, built from `anchor`'s source."""
    return f"llama-server {anchor} {ggufs.file_type(ggufs.llm_gguf(dep))}"


def _exit_on_sigterm(signum: int, frame) -> None:
    """SIGTERM (a timeout, a killed make) unwinds like Ctrl-C, so that the servers, which run in their
    own sessions, are stopped rather than left behind."""
    sys.exit(128 + signum)


def single_turn_cells(workload: str, args: argparse.Namespace) -> list[tuple[str, int, list[str]]]:
    """(cell's workload label, streams, prompts) of a workload's cells, in the order they run."""
    if workload == CATEGORIES:
        return [(category, streams, prompts) for category, prompts in
                category_prompts(args.prompts, CATEGORIES_FROM).items() for streams in args.streams]
    count = args.prompts if workload in ("chat", TEMPLATED) else args.copy_prompts
    cells = [(workload, streams, prompts) for streams, prompts in
             zip(args.streams, workload_prompts(workload, [max(count, s) for s in args.streams]))]
    for _, streams, prompts in cells:
        if len(prompts) < streams:  # a later cell would run fewer requests at once than its label says
            raise MissingPromptSet(f"the {workload} prompts ran out: {len(prompts)} left for the {streams}-stream "
                                   f"cell (each cell takes fresh ones, at least one a stream); fewer --prompts or "
                                   f"--streams, or larger sets ({CHAT_SETS_VAR}, datasets/README.md)")
    return cells


def slice_bounds(count: int, streams: int, slices: int) -> list[tuple[int, int]]:
    """A cell's `count` prompts cut into at most `slices` consecutive runs of at least `streams` each."""
    n = max(1, min(slices, count // max(streams, 1)))
    return [(count * j // n, count * (j + 1) // n) for j in range(n)]


def run_single_turn(workloads: list[str], args: argparse.Namespace, systems: dict[str, Request],
                    sessions: set[int], drafted: dict[str, Callable[[], float]]) -> list[Cell]:
    """Each cell of the workloads (`single_turn_cells`) through every system (`run_cells`)."""
    return run_cells([cell for w in workloads for cell in single_turn_cells(w, args)], args.slices, systems,
                     sessions, drafted)


def run_cells(cells_to_run: list[tuple[str, int, list[str]]], slices: int, systems: dict[str, Request],
              sessions: set[int], drafted: dict[str, Callable[[], float]]) -> list[Cell]:
    """Each (workload, streams, prompts) through every system. With `slices` > 1, the systems take turns
    slice by slice, in an order reversed every slice (A B, B A, ...), so that a machine whose speed
    drifts over minutes weighs on every system alike; a system's cell is its slices together.
    `drafted`: for the systems that say, their running count of draft tokens verified (Cell.drafted_tokens)."""
    cells = []
    for workload, streams, prompts in cells_to_run:
        here = {name: Cell(name, workload, streams) for name in systems}
        foreign_core_s = dict.fromkeys(systems, 0.0)
        for j, (a, b) in enumerate(slice_bounds(len(prompts), streams, slices)):
            for name in (list(systems) if j % 2 == 0 else list(systems)[::-1]):
                before = here[name].wall_s
                count = drafted[name]() if name in drafted else None
                with ForeignCpu(sessions) as foreign:
                    run_cell(name, workload, systems[name], prompts[a:b], streams, into=here[name], first=a)
                foreign_core_s[name] += (foreign.cores or 0.0) * (here[name].wall_s - before)
                if count is not None:
                    here[name].drafted_tokens = (here[name].drafted_tokens or 0.0) + drafted[name]() - count
        for name, cell in here.items():
            cell.foreign_cores = foreign_core_s[name] / cell.wall_s if cell.wall_s else None
            cells.append(cell)
            r = cell.row()
            print(f"{workload:<13} {streams:>3} streams {name:<26} {r['tokens_per_s']:6.1f} tok/s  "
                  f"ITL {r['itl_ms'] or 0:5.1f} ms  others {r['foreign_cores'] or 0:.2f} cores"
                  + (f"  {r['errors']} errors: {cell.errors[0]}" if cell.errors else ""), flush=True)
    return cells


def run_multi_turn(workloads: list[str], args: argparse.Namespace, conversers: dict[str, Converse],
                   sessions: set[int]) -> list[ConversationCell]:
    """Every conversation of a cell through every system; each concurrency has conversations of its own."""
    cells = []
    for workload in workloads:
        offset = MULTI_TURN_FROM
        for streams in args.streams:
            count = max(args.conversations, streams)
            users = conversations(workload, count, offset)
            offset += count
            for name, converse in conversers.items():
                with ForeignCpu(sessions):
                    cell = run_conversations(name, workload, converse, users, streams)
                cells.append(cell)
                for r in cell.rows():
                    print(f"{workload:<15} {streams:>3} streams {name:<26} turn {r['turn']}  TTFT p50 "
                          f"{r['ttft_p50_ms']:7.0f} ms  p99 {r['ttft_p99_ms']:7.0f} ms"
                          + (f"  {len(cell.errors)} errors: {cell.errors[0]}" if cell.errors else ""), flush=True)
    return cells


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--streams", nargs="+", type=int, default=[1, 8, 16])
    p.add_argument("--prompts", type=int, default=16,
                   help="prompts per chat and templated cell (at least one per stream)")
    p.add_argument("--copy-prompts", type=int, default=8,
                   help="prompts per copy-heavy cell (code_edit, passages, summarization; at least one per stream)")
    p.add_argument("--conversations", type=int, default=8,
                   help="conversations per multi-turn cell (at least one per stream)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--slices", type=int, default=1,
                   help="run each cell in up to this many slices, the systems taking turns (ABBA...)")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(DEFAULT_WORKLOADS),
                   help=f"default: all but {CATEGORIES} and the copy-heavy sets that do not ship")
    p.add_argument("--systems", nargs="+", choices=SYSTEM_KEYS, default=list(SYSTEM_KEYS))
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-server threads (-t)")
    p.add_argument("--out", default=str(ROOT / "bench_results" / "peers"))
    args = p.parse_args(argv)
    if CATEGORIES in args.workloads and {"chat", "multi_turn_chat"} & set(args.workloads):
        p.error(f"{CATEGORIES} takes MT-bench's questions that chat and multi_turn_chat take: run it apart")
    return args


def main() -> None:
    args = parse_args()
    require(n for w in args.workloads for n in workload_sets(w))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dep = load_deployment(args.deploy)
    orchestrator = OrchestratorSettings.from_yaml(dep.orchestrator)
    configs, plain = server_configs(dep, args.systems)
    binaries = {anchor: llama_server(anchor=anchor) for anchor in dict.fromkeys(c.anchor for c in configs)}
    reference_label = f"llama-server {ggufs.file_type(ggufs.llm_gguf(dep))}"
    parallel = max(args.streams)
    systems: dict[str, Request] = {}
    conversers: dict[str, Converse] = {}
    sessions: set[int] = set()
    """The servers' process sessions, whose CPU time is the benchmark's own."""
    drafted: dict[str, Callable[[], float]] = {}
    commands: dict[str, str] = {}
    # Each Minions mode has a server of its own, as each llama-server configuration has: no mode finds
    # another's prompts in its prefix cache, and drafters that learn from finished requests (suffix)
    # never see another mode's answers. None sends no speculation (the deployment's default).
    default_label = f"minions {orchestrator.default_speculation}"
    minions_modes = {"minions-default": [(default_label, None)], "minions-off": [(MINIONS_OFF, "off")],
                     "minions-single": [(f"{SINGLE}{ssm['name']}", f"single:{ssm['name']}") for ssm in dep.ssms]}
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with ExitStack() as stack:
        for label, speculation in [mode for key in minions_modes if key in args.systems for mode in minions_modes[key]]:
            log_name = "tritonserver-minions-" + (speculation or "default").replace(":", "-") + ".log"
            triton = stack.enter_context(TritonProcess(args.deploy, log_path=out / log_name))
            sessions.add(triton.proc.pid)
            drafted[label] = functools.partial(metric_value, triton.metrics_url, DRAFTED_METRIC)
            systems[label] = minions_request(triton.grpc_url, orchestrator.model_name, speculation, args.max_tokens)
            conversers[label] = minions_converse(triton.grpc_url, orchestrator.model_name, speculation,
                                                 args.max_tokens)
        for config in configs:
            server = stack.enter_context(LlamaServer(binaries[config.anchor], config, args.threads, parallel,
                                                     orchestrator.limits.context,
                                                     out / f"{config.label.replace(' ', '_')}.log"))
            systems[config.label] = llama_request(server.url, args.max_tokens)
            conversers[config.label] = llama_converse(server.url, args.max_tokens)
            sessions.add(server.proc.pid)
            commands[config.label] = " ".join(server.command)
        for name, request in systems.items():  # first calls pay one-off costs
            run_cell(name, "warm-up", request, warm_up_prompts(2), 2)
        cells = run_single_turn([w for w in args.workloads if w not in MULTI_TURN], args, systems, sessions, drafted)
        # Multi-turn: Minions' modes and llama-server plain on the file the deployment computes with.
        anchors = [anchor_label(a, dep) for a in ANCHOR_KEYS if a in args.systems]
        turn_systems = {default_label, MINIONS_OFF, reference_label, *anchors}
        turn_cells = run_multi_turn([w for w in args.workloads if w in MULTI_TURN], args,
                                    {n: c for n, c in conversers.items() if n in turn_systems}, sessions)
    rows, winner = summarize(cells, plain, MINIONS_OFF)
    text = format_table(rows, winner, MINIONS_OFF) if cells else ""
    anchor_labels = {"pinned": reference_label, **{a: anchor_label(a, dep) for a in ANCHOR_KEYS if a in args.systems}}
    if len(anchor_labels) > 1 and rows:
        text += "\n\n" + format_anchors(rows, default_label, MINIONS_OFF, anchor_labels)
    if any(r["system"].startswith(SINGLE) for r in rows):
        text += "\n\n" + format_drafters(rows, default_label, SINGLE)
    turn_rows = [r for cell in turn_cells for r in cell.rows()]
    if turn_rows:
        reference = {(r["workload"], r["streams"], r["turn"]): r for r in turn_rows if r["system"] == reference_label}
        text += ("\n\nMulti-turn (each turn re-sends the history), TTFT per turn:\n\n"
                 + format_turns(turn_rows, reference))
    print(text)
    (out / "peers.md").write_text(text + "\n")
    meta = {"deploy": str(dep.path), "llm": dep.llm, "default_speculation": orchestrator.default_speculation,
            "llama_cpp_python": pinned_version(), "llama_server_commands": commands,
            "llama_server_sources": {a: str(b.parents[2]) for a, b in binaries.items()}, "max_tokens": args.max_tokens,
            "streams": args.streams, "prompts": {"chat": args.prompts, "copy_heavy": args.copy_prompts},
            "held_out_from": HELD_OUT}
    outputs = [{"system": c.system, "workload": c.workload, "streams": c.streams,
                "texts": {str(i): s.text for i, s in sorted(c.samples.items())}, "errors": c.errors}
               for c in [*cells, *turn_cells]]
    (out / "peers.json").write_text(json.dumps({"meta": meta, "plain_winner": winner, "rows": rows,
                                                "turn_rows": turn_rows, "outputs": outputs}, indent=1, default=str))
    if rows:
        plot(rows, out / "peers.png", f"Minions vs llama-server on {ggufs.llm_gguf(dep).name}, "
                                  f"{os.cpu_count()} CPU cores, greedy, {args.max_tokens} tokens")
    print(f"\nwrote {out / 'peers.md'}, peers.json and peers.png")


if __name__ == "__main__":
    exit_on_missing_set(main)
