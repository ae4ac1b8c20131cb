"""What an LLM step costs, in process (no Triton): plain decoding at 1 and b sequences, and
verifying a draft of k tokens relative to one plain step, for each weight encoding and thread count;
and whether a verification keeps the engine's own greedy tokens.

Speculation pays only where verifying k tokens costs much less than k plain steps; this prints that
ratio for the engine the default deployment serves, and picks its encoding (docs/engines.md). Served,
an encoding keeps greedy decoding's tokens only where a step's result does not depend on what else it
computes: llama.cpp only (`own_greedy_kept`), on the chat prompts of tests/integration, `plain same`
counts outputs of the engine as served (a prefix cache: the chat template's system prompt is a hit)
equal to one computed from scratch a token a step, and `drafts kept` the verifications of that
output, OWN_DRAFT tokens at a time, that accepted every token. Each miss is a place where Minions'
output would leave the LLM's own greedy decoding.

    python -m benchmarks.bench_engine_costs [--encodings Q4_1 F16] [--threads 1 2]
    python -m benchmarks.bench_engine_costs --engine torch --device cuda --dtypes bfloat16 float32
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.deploy.artifacts import hf_dir_for, repacked_gguf, smollm2_gguf, tokenizer_dir_for
from minions.deploy.config import ROOT, Deployment, load_deployment
from minions.engines.api import Engine
from minions.engines.factory import build_engine
from minions.engines.llamacpp_engine import LlamaCppEngine
from minions.settings import EngineSettings
from minions.text.prompt import encode_prompt
from harness.prompts import kept_prompts

Reference = Callable[[], Engine]
"""Makes an engine that computes a prompt's greedy continuation from scratch (own_greedy_kept)."""

CONTEXT = 200
VERIFY_LENGTHS = (1, 2, 4, 8, 16)
OWN_TOKENS, OWN_DRAFT = 64, 16


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


def chat_prompts(dep: Deployment) -> list[list[int]]:
    """The greedy-equality test prompts, encoded as the orchestrator encodes a chat request."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir_for("smollm2", dep))
    return [encode_prompt(tokenizer, text, chat=True) for text in kept_prompts("greedy_equality")]


def own_greedy_kept(engine: Engine, reference: Engine, prompts: list[list[int]]) -> tuple[int, int, int]:
    """(outputs equal to the reference's, verifications that accepted all of the reference's tokens,
    verifications). The reference computes each prompt's greedy continuation from scratch, one token
    a step; `engine` (its prefix cache on, as served: the chat template's system prompt is a hit)
    decodes it plainly, then verifies drafts of its next OWN_DRAFT tokens from every OWN_DRAFT-th
    position."""
    same = kept = total = 0
    for prompt in prompts:
        own = reference.generate(EngineRequest("own", prompt, OWN_TOKENS)).tokens
        reference.release("own")
        same += engine.generate(EngineRequest("own", prompt, OWN_TOKENS)).tokens == own
        engine.release("own")
        for start in range(0, len(own) - OWN_DRAFT, OWN_DRAFT):
            draft = own[start : start + OWN_DRAFT]
            result = engine.generate(EngineRequest("own", prompt + own[:start], OWN_DRAFT + 1, draft=draft))
            engine.release("own")
            kept += result.tokens[:OWN_DRAFT] == draft
            total += 1
    return same, kept, total


def llamacpp_engines(args: argparse.Namespace, dep: Deployment) -> Iterator[tuple[str, Engine, Reference | None]]:
    """llama.cpp on the SmolLM2 GGUF, per weight encoding and thread count, its KV laid out as the
    deployment's LLM keeps it (kv_unified, batch_invariant), each with a reference of one sequence and
    no prefix cache (own_greedy_kept), made only once the costs are timed: an engine warms up on its
    own thread as it loads, and a reference made beside the engine warmed up during its first timings
    (docs/engines.md, "What a step costs")."""
    shipped = smollm2_gguf()
    llm = EngineSettings.from_yaml(dep.raw["llm"])
    layout = {"kv_unified": llm.kv_unified, "batch_invariant": llm.batch_invariant}
    for encoding in args.encodings:
        path = shipped if encoding.upper() == "Q4_1" else repacked_gguf(shipped, encoding, dep.cache_dir)
        for threads in args.threads:
            yield (f"{encoding} {threads}t",
                   LlamaCppEngine(str(path), num_threads=threads, max_sequences=max(args.batch, 2), n_ctx=512,
                                  **layout),
                   functools.partial(LlamaCppEngine, str(path), num_threads=threads, max_sequences=1, n_ctx=512,
                                     prefix_caching=False, **layout))


def torch_engines(args: argparse.Namespace, dep: Deployment) -> Iterator[tuple[str, Engine, Reference | None]]:
    """The torch engine on SmolLM2 (dequantised from its GGUF), per dtype, on `--device`."""
    path = str(hf_dir_for("smollm2", dep))
    for dtype in args.dtypes:
        settings = EngineSettings(engine="torch", model_path=path, device=args.device, dtype=dtype,
                                  num_threads=args.threads[0], max_sequences=max(args.batch, 2), max_context=512)
        yield f"{dtype} {args.device}", build_engine(settings), None


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
    engines = llamacpp_engines(args, dep) if args.engine == "llamacpp" else torch_engines(args, dep)
    prompts = chat_prompts(dep)
    print(f"{'engine':16} {'1 seq ms/tok':>12} {f'{args.batch} seq ms/tok':>12} "
          + " ".join(f"{f'verify {k}':>9}" for k in VERIFY_LENGTHS) + f" {'plain same':>11} {'drafts kept':>11}")
    for label, engine, make_reference in engines:
        one = plain_ms_per_token(engine, 1)
        many = plain_ms_per_token(engine, args.batch)
        ratios = [verify_ms(engine, k) / one for k in VERIFY_LENGTHS]
        exact = ""
        if make_reference is not None:
            reference = make_reference()
            same, kept, total = own_greedy_kept(engine, reference, prompts)
            exact = f" {f'{same}/{len(prompts)}':>11} {f'{kept}/{total}':>11}"
            reference.close()
        print(f"{label:16} {one:>12.2f} {many:>12.2f} " + " ".join(f"{r:>8.2f}x" for r in ratios) + exact,
              flush=True)
        if hasattr(engine, "close"):
            engine.close()


if __name__ == "__main__":
    main()
