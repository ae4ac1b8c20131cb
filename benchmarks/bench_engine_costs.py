"""What an LLM step costs, in process (no Triton): plain decoding at 1 and b sequences, and
verifying a draft of k tokens relative to one plain step, for each weight encoding and thread count.

Speculation pays only where verifying k tokens costs much less than k plain steps; this prints that
ratio for the engine the default deployment serves, and picks its encoding (docs/engines.md).

    python -m benchmarks.bench_engine_costs [--encodings Q4_1 F16] [--threads 1 2]
    python -m benchmarks.bench_engine_costs --engine torch --device cuda --dtypes bfloat16 float32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.deploy.artifacts import hf_dir_for, repacked_gguf, smollm2_gguf
from minions.deploy.config import ROOT, Deployment, load_deployment
from minions.engines.api import Engine
from minions.engines.factory import build_engine
from minions.engines.llamacpp_engine import LlamaCppEngine
from minions.settings import EngineSettings

CONTEXT = 200
VERIFY_LENGTHS = (1, 2, 4, 8, 16)


def prompt(seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 40000, CONTEXT)]


def plain_ms_per_token(engine: Engine, sequences: int, tokens: int = 32) -> float:
    """Milliseconds per generated token of each sequence, `sequences` generating together."""
    calls = [EngineRequest(f"p{i}", prompt(i), 1) for i in range(sequences)]
    engine.generate_batch(calls)  # prefill, not timed
    calls = [EngineRequest(c.request_id, c.input_ids + [7], tokens) for c in calls]
    start = time.perf_counter()
    engine.generate_batch(calls)
    elapsed = time.perf_counter() - start
    for c in calls:
        engine.release(c.request_id)
    return 1000 * elapsed / tokens


def verify_ms(engine: Engine, k: int, repeats: int = 12) -> float:
    """Median milliseconds of one verification of k draft tokens (all rejected, so each call redoes k)."""
    base = prompt(100)
    engine.generate(EngineRequest("v", base, 1))
    times = []
    for _ in range(repeats):
        draft = [1] * k
        start = time.perf_counter()
        engine.generate(EngineRequest("v", base + [7], k + 1, draft=draft))
        times.append(time.perf_counter() - start)
    engine.release("v")
    return 1000 * statistics.median(times)


def llamacpp_engines(args: argparse.Namespace, cache: Path) -> Iterator[tuple[str, Engine]]:
    """llama.cpp on the SmolLM2 GGUF, per weight encoding and thread count."""
    shipped = smollm2_gguf()
    for encoding in args.encodings:
        path = shipped if encoding.upper() == "Q4_1" else repacked_gguf(shipped, encoding, cache)
        for threads in args.threads:
            yield f"{encoding} {threads}t", LlamaCppEngine(str(path), num_threads=threads,
                                                          max_sequences=max(args.batch, 2), n_ctx=512)


def torch_engines(args: argparse.Namespace, dep: Deployment) -> Iterator[tuple[str, Engine]]:
    """The torch engine on SmolLM2 (dequantised from its GGUF), per dtype, on `--device`."""
    path = str(hf_dir_for("smollm2", dep))
    for dtype in args.dtypes:
        settings = EngineSettings(engine="torch", model_path=path, device=args.device, dtype=dtype,
                                  num_threads=args.threads[0], max_sequences=max(args.batch, 2), max_context=512)
        yield f"{dtype} {args.device}", build_engine(settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["llamacpp", "torch"], default="llamacpp")
    parser.add_argument("--encodings", nargs="+", default=["Q4_1", "F16"], help="llamacpp; Q4_1 = the GGUF as shipped")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], help="torch")
    parser.add_argument("--device", default="cpu", help="torch: cpu, cuda, cuda:N")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    dep = load_deployment(ROOT / "deploy.yaml")
    engines = llamacpp_engines(args, dep.cache_dir) if args.engine == "llamacpp" else torch_engines(args, dep)
    print(f"{'engine':16} {'1 seq ms/tok':>12} {f'{args.batch} seq ms/tok':>12} "
          + " ".join(f"{f'verify {k}':>9}" for k in VERIFY_LENGTHS))
    for label, engine in engines:
        one = plain_ms_per_token(engine, 1)
        many = plain_ms_per_token(engine, args.batch)
        ratios = [verify_ms(engine, k) / one for k in VERIFY_LENGTHS]
        print(f"{label:16} {one:>12.2f} {many:>12.2f} " + " ".join(f"{r:>8.2f}x" for r in ratios), flush=True)
        if hasattr(engine, "close"):
            engine.close()


if __name__ == "__main__":
    main()
