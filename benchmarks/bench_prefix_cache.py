"""What resending the whole sequence every round costs, with and without the engine's prefix KV cache.

The orchestrator resends the full sequence each round (as TensorRT-LLM's draft-target BLS does). With
the prefix cache an engine computes only the tokens past the longest common prefix; without it, it
would recompute everything. Measured in-process on the real SmolLM2 fp32 verifier: one verification
round (5 new tokens) at several sequence lengths, plus the bookkeeping cost alone (prefix match and
cache crop) and the KV memory per token.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from minions.decoding.engine_call import EngineRequest
from minions.decoding.tokens import common_prefix_len
from minions.deploy.artifacts import hf_dir_for
from minions.deploy.config import ROOT, load_deployment
from minions.engines.torch_engine import TorchEngine
from minions.engines.torch_models import load_causal_lm


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(2)
    model = load_causal_lm(str(hf_dir_for("smollm2", load_deployment(ROOT / "deploy.yaml"))))
    engine = TorchEngine(model, max_sequences=4, max_context=4096)
    rng = np.random.default_rng(0)
    print(f"{'seq len':>8} {'cached round ms':>16} {'uncached round ms':>18} {'bookkeeping ms':>15}")
    for length in args.lengths:
        sequence = rng.integers(100, 40000, size=length).tolist()
        draft = rng.integers(100, 40000, size=4).tolist()
        engine.generate(EngineRequest("warm", sequence, 1))

        def cached():
            # the previous round's state: the sequence minus its last token is cached
            engine.cache.get("warm").state.crop(-1)
            engine.cache.get("warm").tokens = sequence[:-1]
            engine.generate(EngineRequest("warm", sequence, 5, draft=draft))

        def uncached():
            engine.release("cold")
            engine.generate(EngineRequest("cold", sequence, 5, draft=draft))

        bookkeeping = _median_ms(lambda: common_prefix_len(sequence, sequence + draft), 50)
        print(f"{length:>8} {_median_ms(cached, args.repeats):>16.1f} {_median_ms(uncached, args.repeats):>18.1f} "
              f"{bookkeeping:>15.3f}")
    cfg = model.config
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    print(f"\nKV cache per token: {kv_bytes / 1024:.1f} KiB (fp32) -> {kv_bytes * 2048 / 2**20:.0f} MiB for a full 2048-token context")


if __name__ == "__main__":
    main()
