"""Plain decoding of the llama.cpp engine stepping alone in process (no Triton, no orchestrator)
against llama-server on the same GGUF, same threads and slots: where the gap of Minions `off` to
llama-server lies (docs/benchmarks.md). Random prompts (fresh each run, so no prefix cache helps),
a fixed number of tokens each (no end token), prefill included; the engine is measured before and
after llama-server, and their mean compared.

    python -m benchmarks.bench_engine_parity [--streams 1 8 16] [--threads 2] [--prompt-tokens 200] [--tokens 128]
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.peers.llama_server import LlamaServer, ServerConfig
from benchmarks.peers.llama_server_build import llama_server
from minions.decoding.engine_call import EngineRequest
from minions.deploy.config import ROOT, load_deployment
from minions.deploy.render import engine_settings
from minions.engines.llamacpp_engine import LlamaCppEngine
from minions.settings import DEFAULTS

SEEDS = itertools.count(1000)


def random_prompt(tokens: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(next(SEEDS)).integers(100, 40000, tokens)]


def engine_tok_s(engine: LlamaCppEngine, streams: int, prompt_tokens: int, tokens: int) -> float:
    calls = [EngineRequest(f"parity-{next(SEEDS)}", random_prompt(prompt_tokens), tokens) for _ in range(streams)]
    start = time.perf_counter()
    results = engine.generate_batch(calls)
    assert all(len(r.tokens) == tokens for r in results)
    return streams * tokens / (time.perf_counter() - start)


def server_tok_s(url: str, streams: int, prompt_tokens: int, tokens: int) -> float:
    def one() -> None:
        body = {"prompt": random_prompt(prompt_tokens), "n_predict": tokens, "ignore_eos": True, "temperature": 0,
                "cache_prompt": False}
        request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=600).read()

    threads = [threading.Thread(target=one) for _ in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return streams * tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    dep = load_deployment(args.deploy)
    settings = engine_settings(dep.llm, dep, DEFAULTS)
    slots = max(args.streams)

    def engine_run() -> dict[int, float]:
        engine = LlamaCppEngine(settings.model_path, args.threads, slots, DEFAULTS.limits.context)
        try:
            engine_tok_s(engine, 2, args.prompt_tokens, 8)  # warm
            return {n: engine_tok_s(engine, n, args.prompt_tokens, args.tokens) for n in args.streams}
        finally:
            engine.close()

    before = engine_run()
    config = ServerConfig("llama-server", Path(settings.model_path))
    log = ROOT / "bench_results" / "engine-parity-llama-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with LlamaServer(llama_server(), config, args.threads, slots, DEFAULTS.limits.context, log) as server:
        server_tok_s(server.url, 2, args.prompt_tokens, 8)  # warm
        served = {n: server_tok_s(server.url, n, args.prompt_tokens, args.tokens) for n in args.streams}
    after = engine_run()
    print(f"{Path(settings.model_path).name}, {args.threads} threads, {slots} slots, "
          f"{args.prompt_tokens}-token prompts, {args.tokens} tokens each")
    for n in args.streams:
        mean = (before[n] + after[n]) / 2
        print(f"{n:3d} streams: engine {before[n]:6.1f} / {after[n]:6.1f} tok/s, llama-server {served[n]:6.1f} tok/s, "
              f"ratio {mean / served[n]:.2f}")


if __name__ == "__main__":
    main()
