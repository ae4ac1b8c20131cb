"""Every tool's prompt loading with its own defaults, and nothing else (no server, no model): `python -m
benchmarks.prompt_loading` prints, as JSON, each tool's cells (lists of prompts) by name. A missing
prompt set raises. tests/unit/test_prompt_sets_alone.py runs it in a copy of the project with nothing
beside it, as a user's clone is."""

from __future__ import annotations

import json
from collections.abc import Callable

from benchmarks import bench_load, bench_paired, bench_peers, bench_speculation, gpu_check, soak
from benchmarks.chaos import run as chaos
from benchmarks.bench_draft_choice import workloads as draft_choice_workloads
from benchmarks.peers.conversations import WORKLOADS as MULTI_TURN
from benchmarks.peers.conversations import conversations
from benchmarks.trace_draft_length import phases
from loadtest import options as loadtest_options
from loadtest import run as loadtest_run
from minions.distill.__main__ import prompt_split
from minions.text.datasets import chat_sets, mixed_prompts, named_sets, warm_up_prompts

Cells = dict[str, list[str]]


def _load_sweep(datasets: list[str] | None) -> Cells:
    args = bench_load.parser().parse_args(["--datasets", *datasets] if datasets else [])
    cells = bench_load.cell_prompts(args.streams, args.min_requests, args.repeat, args.datasets)
    return {f"{c} streams, repeat {r}": prompts for (c, r), prompts in cells.items()} | {"warm-up": warm_up_prompts(2)}


def _by_workload(workloads: list[str], conversation_count: int, single_turn: Callable[[str], Cells]) -> Cells:
    """The cells of each workload: a multi-turn one's turns in one cell, a single-turn one's from `single_turn`."""
    cells: Cells = {}
    for workload in workloads:
        if workload in MULTI_TURN:
            talks = conversations(workload, conversation_count, bench_peers.MULTI_TURN_FROM)
            cells[workload] = [turn for talk in talks for turn in talk]
        else:
            cells |= single_turn(workload)
    return cells


def _peers() -> Cells:
    args = bench_peers.parse_args([])
    return _by_workload(args.workloads, args.conversations, lambda w: {
        f"{w} {streams}": prompts for w, streams, prompts in bench_peers.single_turn_cells(w, args)})


def _paired() -> Cells:
    args = bench_paired.parser().parse_args([])
    return _by_workload(args.workloads, args.conversations, lambda w: bench_paired.single_turn(w, args.prompts))


def _categories() -> Cells:
    args = bench_peers.parse_args(["--workloads", bench_peers.CATEGORIES])
    cells = bench_peers.single_turn_cells(bench_peers.CATEGORIES, args)
    return {f"{w} {streams}": prompts for w, streams, prompts in cells}


def _speculation() -> Cells:
    args = bench_speculation.parser().parse_args([])
    return bench_speculation.replay_prompts(args.datasets or chat_sets(), args.prompts_per_dataset)


def _chaos() -> Cells:
    s = chaos.parse_args([])
    return {"load": mixed_prompts(s.prompts, named_sets(s.datasets))}


def _distill() -> Cells:
    validation, training = prompt_split(chat_sets(), 6)
    return {"validation": validation, "training": training}


TOOLS: dict[str, Callable[[], Cells]] = {
    "make loadtest": lambda: {"users": loadtest_options.prompts(loadtest_run.parse_args([]))},
    "make bench (bench_speculation)": _speculation,
    "make bench (bench_load)": lambda: _load_sweep(None),
    "make bench (trace_draft_length)": lambda: phases(4),
    "make bench-peers": _peers,
    "make bench-peers --workloads categories": _categories,
    "make bench-paired": _paired,
    "make soak": lambda: {f"{w} {s}": soak.wave_prompts(w, s, 0) for w, s in soak.WAVES},
    "make chaos": _chaos,
    "make distill": _distill,
    **{f"make gpu-check ({name})": lambda d=datasets: _load_sweep(d) for name, datasets in gpu_check.SWEEPS.items()},
    "bench_draft_choice": lambda: draft_choice_workloads(24, 12, 8),
}


if __name__ == "__main__":
    print(json.dumps({tool: load() for tool, load in TOOLS.items()}))
