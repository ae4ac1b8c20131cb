"""How often llama.cpp, at each weight encoding, picks the fp32 LLM's own greedy token, and at what cost.

ssm_q4 runs the LLM's own weights (SmolLM2's Q4_1 GGUF) in llama.cpp; the verifier runs them
dequantised to fp32 in PyTorch. They differ in arithmetic only: llama.cpp quantises activations to
8 bits for its Q4_1/Q8_0 dot products and computes in half precision for F16. This measures what that
costs in agreement, teacher-forced: the LLM decodes greedily, then llama.cpp reads the same tokens and
its argmax is compared with the LLM's token at every position (the chance a draft token passes, given
the ones before it did). Also the decode step (one sequence, one thread) and the prompt prefill per
token. The re-encoded files are made once under cache_dir, as deploy.yaml's `repack` does.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from minions.deploy.artifacts import hf_dir_for, repacked_gguf, smollm2_gguf
from minions.deploy.config import ROOT, load_deployment
from minions.engines.torch_models import load_causal_lm
from minions.text.datasets import chat_sets, load_prompts

SHIPPED = "Q4_1"


def teacher_sequences(per_dataset: int, new_tokens: int, offset: int) -> list[tuple[int, list[int]]]:
    """(prompt length, prompt + the LLM's greedy continuation) for prompts of every dataset."""
    from transformers import AutoTokenizer

    path = str(hf_dir_for("smollm2", load_deployment(ROOT / "deploy.yaml")))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_causal_lm(path)
    out = []
    for name in chat_sets():
        for prompt in load_prompts(name, per_dataset, offset):
            ids = tokenizer(prompt)["input_ids"]
            with torch.no_grad():
                seq = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.eos_token_id)
            out.append((len(ids), seq[0].tolist()))
    return out


def measure(file_type: str, sequences: list[tuple[int, list[int]]], threads: int) -> dict:
    import llama_cpp

    dep = load_deployment(ROOT / "deploy.yaml")
    path = smollm2_gguf() if file_type == SHIPPED else repacked_gguf(smollm2_gguf(), file_type, dep.cache_dir)
    llm = llama_cpp.Llama(str(path), n_ctx=1024, n_threads=threads, logits_all=True, verbose=False)
    agree = total = 0
    prefill_s = prefill_tokens = 0.0
    for prompt_len, ids in sequences:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids[:prompt_len])
        prefill_s += time.perf_counter() - t
        prefill_tokens += prompt_len
        llm.eval(ids[prompt_len:-1])
        picks = np.asarray(llm.scores[prompt_len - 1: len(ids) - 1]).argmax(-1)
        agree += int((picks == np.asarray(ids[prompt_len:])).sum())
        total += len(ids) - prompt_len
    ids = sequences[0][1]
    llm.reset()
    llm.eval(ids[:8])
    steps = min(32, len(ids) - 8)
    t = time.perf_counter()
    for token in ids[8: 8 + steps]:
        llm.eval([token])
    step_ms = 1000 * (time.perf_counter() - t) / steps
    return {"type": file_type, "agree": agree, "total": total, "step_ms": step_ms,
            "prefill_ms": 1000 * prefill_s / prefill_tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=[SHIPPED, "Q8_0", "BF16", "F16"])
    p.add_argument("--prompts-per-dataset", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--offset", type=int, default=10, help="skip the prompts the load sweep uses")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(2)
    sequences = teacher_sequences(args.prompts_per_dataset, args.new_tokens, args.offset)
    print(f"{'type':<6} {'agreement':>18} {'decode ms/step':>15} {'prefill ms/token':>17}")
    for file_type in args.types:
        r = measure(file_type, sequences, args.threads)
        print(f"{r['type']:<6} {r['agree'] / r['total']:>7.4f} ({r['agree']:>4}/{r['total']:<4}) "
              f"{r['step_ms']:>15.1f} {r['prefill_ms']:>17.1f}", flush=True)


if __name__ == "__main__":
    main()
