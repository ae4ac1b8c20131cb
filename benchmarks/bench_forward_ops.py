"""Operators (and, on a GPU, kernel launches) per step of the torch engine's packed forward, by rows and
draft length: the count must not grow with either (issue 63; its unit test checks the shape on a tiny model).

Loads the deployment's torch LLM (deploy.torch.yaml: SmolLM2-135M fp32) on --device, gives each of
--rows sequences a prompt of about --context tokens, then times --steps steps in which every row sends
one token and a draft of --drafts tokens (0: a plain decoding step). Per cell: torch operators dispatched
in one step (DispatchCount), on CUDA the kernels one step launched (torch.profiler), and the median ms
of a step; launches and ms per row are per token in a plain step. On CUDA every cell runs eagerly and
then through CUDA graphs captured for the cells' buckets (engines/cuda_graphs.py). Writes
forward_ops.md and .json under --out.

    python -m benchmarks.bench_forward_ops [--device cpu] [--rows 1 8 16] [--drafts 0 4 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from minions.deploy.artifacts import hf_dir_for
from minions.deploy.config import ROOT, load_deployment
from minions.engines.cuda_graphs import cuda_graph_runner
from minions.engines.dispatch_count import DispatchCount
from minions.engines.packed_forward import ForwardBackend, ForwardRow, forward_backend
from minions.engines.torch_models import load_causal_lm


def kernel_launches(step) -> int:
    """CUDA kernels one call of `step` launched."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


POOL_BYTES = 2**30
"""The KV pool, sized at once (graphs hold its tensors): far more than the cells take."""
GRAPH_BYTES = 2**30


def measure(backend: ForwardBackend, rows: int, draft: int, context: int, steps: int, seed: int) -> dict:
    """One cell: operators, launches (CUDA) and step times of `rows` rows drafting `draft` tokens."""
    cuda = backend.device.type == "cuda"
    rng = np.random.default_rng(seed)
    states = [backend.new_state() for _ in range(rows)]
    backend.forward([ForwardRow(s, rng.integers(100, 5000, context + 3 * i).tolist(), 1)
                     for i, s in enumerate(states)])

    def step() -> None:
        tokens = rng.integers(100, 5000, (rows, draft + 1)).tolist()
        backend.forward([ForwardRow(s, t, draft + 1) for s, t in zip(states, tokens)])
        for s in states:  # the verified tokens are cropped again: every step sees the same context
            backend.crop(s, backend.length(s) - draft - 1)

    step()  # the first pass of a shape pays one-off costs
    with DispatchCount() as count:
        step()
    launches = kernel_launches(step) if cuda else None
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    ms = 1000 * statistics.median(times)
    graphs = getattr(backend, "runner", None) is not None
    return {"rows": rows, "draft": draft, "graphs": graphs, "operators": count.total, "kernel_launches": launches,
            "ms_per_step": round(ms, 3), "ms_per_row_token": round(ms / rows, 3)}


def format_table(cells: list[dict]) -> str:
    lines = ["| rows | draft | CUDA graphs | operators / step | kernel launches / step | launches / row | ms / step "
             "| ms / row |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['rows']} | {c['draft']} | {'yes' if c['graphs'] else 'no'} | {c['operators']} | "
              f"{c['kernel_launches'] or '-'} | "
              f"{round(c['kernel_launches'] / c['rows']) if c['kernel_launches'] else '-'} | "
              f"{c['ms_per_step']:.1f} | {c['ms_per_row_token']:.2f} |" for c in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.torch.yaml"), help="its llm (torch) is loaded")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", nargs="+", type=int, default=[1, 8, 16])
    p.add_argument("--drafts", nargs="+", type=int, default=[0, 4, 16])
    p.add_argument("--context", type=int, default=200, help="prompt tokens per row")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "bench_results" / "forward_ops"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dep = load_deployment(args.deploy)
    model = load_causal_lm(str(hf_dir_for(dep.llm["source"], dep)), dep.llm.get("dtype", "float32"),
                           device=args.device)
    cells = []
    for graphs in ([False, True] if args.device.startswith("cuda") else [False]):
        backend = forward_backend(model, POOL_BYTES if graphs else 0)
        if graphs:
            backend.runner = cuda_graph_runner(backend, max(args.rows), max(args.drafts),
                                               args.context + 4 * max(args.rows) + max(args.drafts) + 1, GRAPH_BYTES)
        for rows in args.rows:
            for draft in args.drafts:
                cells.append(measure(backend, rows, draft, args.context, args.steps, seed=rows * 100 + draft))
                print(format_table(cells[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = (f"Packed forward of {dep.llm['source']} ({args.device}, {args.threads} thread(s), {args.context}-token "
            f"contexts):\n\n{format_table(cells)}")
    (out / "forward_ops.md").write_text(text + "\n")
    (out / "forward_ops.json").write_text(json.dumps({"device": args.device, "cells": cells}, indent=1))
    print(f"\n{text}\n\nwrote {out / 'forward_ops.md'}")


if __name__ == "__main__":
    main()
