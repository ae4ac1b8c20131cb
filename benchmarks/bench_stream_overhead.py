"""What Triton and the orchestrator add to a plain token: Minions `off` streamed through the real
server against the same llama.cpp engine stepping alone in process, one stream, same prompts and settings.

`off` is one streaming engine call (the engine model sends its tokens over gRPC as they are made, at
most every `stream_interval_ms`; the orchestrator forwards each response), so the server's cost per
token is what those hops take beyond the engine's own step.

    python -m benchmarks.bench_stream_overhead [--deploy deploy.yaml] [--prompts 6] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from client.api import GenerationParams, generate_grpc
from minions.decoding.engine_call import EngineRequest
from minions.deploy.artifacts import tokenizer_dir_for
from minions.deploy.config import load_deployment
from minions.deploy.render import engine_settings
from minions.engines.factory import build_engine
from minions.settings import DEFAULTS
from minions.text.datasets import mixed_prompts
from minions.text.prompt import encode_prompt
from tests.support.triton_process import ROOT, TritonProcess


def served_ms_per_token(deploy: Path, prompts: list[str], max_tokens: int) -> tuple[float, list[int]]:
    """Median inter-token time of `off` streamed through the server; the output lengths."""
    with TritonProcess(deploy) as server:
        params = GenerationParams(max_tokens=max_tokens, chat=True, speculation="off", temperature=0.0)
        generate_grpc(server.grpc_url, "minions", prompts[0], params)  # warm
        itls, lengths = [], []
        for prompt in prompts:
            out = generate_grpc(server.grpc_url, "minions", prompt, params, stream=True)
            itls.append((out.latency_s - out.ttft_s) / max(out.num_output_tokens - 1, 1))
            lengths.append(out.num_output_tokens)
    return 1000 * statistics.median(itls), lengths


def engine_ms_per_token(deploy: Path, prompts: list[str], lengths: list[int]) -> float:
    """Median per-token time of the same engine generating the same lengths alone, in process."""
    from transformers import AutoTokenizer

    dep = load_deployment(deploy)
    engine = build_engine(engine_settings(dep.llm, dep, DEFAULTS))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir_for(dep.llm["source"], dep))
    times = []
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        ids = encode_prompt(tokenizer, prompt, chat=True)
        engine.generate(EngineRequest(f"w{i}", list(ids), 1))  # prefill, not timed
        start = time.perf_counter()
        engine.generate(EngineRequest(f"w{i}", list(ids) + [tokenizer.eos_token_id or 0], max(n - 1, 1)))
        times.append((time.perf_counter() - start) / max(n - 1, 1))
        engine.release(f"w{i}")
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", type=Path, default=ROOT / "deploy.yaml")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    prompts = mixed_prompts(args.prompts, offset=40)  # past the prompts other benches warm with
    served, lengths = served_ms_per_token(args.deploy, prompts, args.max_tokens)
    alone = engine_ms_per_token(args.deploy, prompts, lengths)
    print(f"off through Triton and the orchestrator: {served:.2f} ms/token; the engine alone: {alone:.2f} ms/token; "
          f"overhead {served - alone:+.2f} ms/token ({served / alone - 1:+.1%})")


if __name__ == "__main__":
    main()
