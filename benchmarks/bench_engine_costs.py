"""What a llama.cpp LLM step costs, in process (no Triton): plain decoding at 1 and b sequences, and
verifying a draft of k tokens relative to one plain step, for each weight encoding and thread count.

Speculation pays only where verifying k tokens costs much less than k plain steps; this prints that
ratio for the engine the default deployment serves, and picks its encoding (docs/engines.md).

    python -m benchmarks.bench_engine_costs [--encodings Q4_1 F16] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from minions.deploy.artifacts import repacked_gguf, smollm2_gguf
from minions.deploy.config import ROOT, load_deployment
from minions.engines.api import EngineRequest
from minions.engines.llamacpp_engine import LlamaCppEngine

CONTEXT = 200


def prompt(seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 40000, CONTEXT)]


def plain_ms_per_token(engine: LlamaCppEngine, sequences: int, tokens: int = 32) -> float:
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


def verify_ms(engine: LlamaCppEngine, k: int, repeats: int = 12) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", nargs="+", default=["Q4_1", "F16"], help="Q4_1 = the GGUF as shipped")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    cache = load_deployment(ROOT / "deploy.yaml").cache_dir
    shipped = smollm2_gguf()
    print(f"{'encoding':9} {'threads':>7} {'1 seq ms/tok':>12} {f'{args.batch} seq ms/tok':>12} "
          + " ".join(f"{f'verify {k}':>9}" for k in (1, 2, 4, 8, 16)))
    for encoding in args.encodings:
        path = shipped if encoding.upper() == "Q4_1" else repacked_gguf(shipped, encoding, cache)
        for threads in args.threads:
            engine = LlamaCppEngine(str(path), num_threads=threads, max_sequences=max(args.batch, 2), n_ctx=512)
            one = plain_ms_per_token(engine, 1)
            many = plain_ms_per_token(engine, args.batch)
            ratios = [verify_ms(engine, k) / one for k in (1, 2, 4, 8, 16)]
            print(f"{encoding:9} {threads:>7} {one:>12.2f} {many:>12.2f} " + " ".join(f"{r:>8.2f}x" for r in ratios))
            engine.close()


if __name__ == "__main__":
    main()
