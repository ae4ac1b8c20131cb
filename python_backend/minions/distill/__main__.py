"""`make distill`: train the distilled SSMs from the deployment's LLM and write them to the cache.

1. The LLM greedily continues chat-formatted prompts of the chat sets (minions.text.datasets: MT-bench
   as shipped, MINIONS_CHAT_SETS for larger ones; a training range that the benchmarks' prompts never
   touch, and a validation range), labelled per position.
   Prompts left when the generation budget runs out are labelled prompt-only (one forward each).
2. `ssm_d2`: the LLM's embeddings + layers 0-1 + a reduced-vocabulary head, trained on those labels
   (keeping the weights with the best validation loss).
3. `ssm_d4b`: layers 0-3, "boost-tuned": positions ssm_d2 gets wrong weigh more, so the two SSMs
   err differently, which is what a vote needs.
4. Each is replayed on the validation split (greedy acceptance at k=4, ms per draft token) and the
   result goes into its manifest.json; the deployment serves every SSM whose directory is complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from minions.deploy.artifacts import hf_dir_for, smollm2_gguf
from minions.deploy.config import ROOT, load_or_exit
from minions.engines.distilled_model import MANIFEST_FILE, DistilledDraftModel, is_distilled_dir, load_draft_model
from minions.engines.torch_engine import TorchEngine
from minions.engines.torch_models import load_causal_lm
from minions.text.datasets import DATASETS, chat_sets, exit_on_missing_set, load_prompts, require
from minions.text.prompt import encode_prompt

from .evaluate import replay_acceptance
from .teacher_data import Example, label_prompts, teacher_generate
from .train import TrainConfig, boost_weights, greedy_predictions, reduced_vocab, train_draft, vocab_coverage

log = logging.getLogger("minions.distill")
BENCH_PROMPTS = 20
"""The benchmarks read the first prompts of each dataset (minions.text.datasets, MINIONS_DATASETS to move it);
validation starts after them, training after that."""


def interleave(groups: list[list]) -> list:
    """Round-robin over the datasets, so a time budget that stops early still covers all of them."""
    out = []
    for i in range(max(len(g) for g in groups)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def prompt_split(names: list[str], val_per_dataset: int) -> tuple[list[str], list[str]]:
    """(validation, training) prompts of the named sets, each interleaved over the sets: validation from
    BENCH_PROMPTS on, training after it."""
    val_stop = BENCH_PROMPTS + val_per_dataset
    return (interleave([load_prompts(n, val_per_dataset, BENCH_PROMPTS) for n in names]),
            interleave([load_prompts(n, 10**9, val_stop) for n in names]))


def encode_all(tokenizer, texts: list[str], max_prompt_tokens: int) -> list[list[int]]:
    ids = [encode_prompt(tokenizer, t, chat=True) for t in texts]
    return [p for p in ids if len(p) <= max_prompt_tokens]


def build_data(args, teacher, tokenizer, out: Path) -> tuple[list[Example], list[Example], dict]:
    """Generated examples, then the leftover training prompts labelled prompt-only; both cached."""
    cache, prompt_cache = out / "teacher_data.pt", out / "teacher_prompts.pt"
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    names = chat_sets()
    val_stop = BENCH_PROMPTS + args.val_per_dataset
    val_texts, train_texts = prompt_split(names, args.val_per_dataset)
    train_prompts = encode_all(tokenizer, train_texts, args.max_prompt_tokens)
    if cache.exists() and not args.regenerate:
        saved = torch.load(cache, weights_only=False)
        train, val, meta = saved["train"], saved["val"], saved["meta"]
        log.info("reusing %s (%d train, %d validation examples)", cache, len(train), len(val))
    else:
        val_prompts = encode_all(tokenizer, val_texts, args.max_prompt_tokens)
        val, _ = teacher_generate(teacher, val_prompts, max_new_tokens=args.max_new_tokens,
                                  batch_size=args.batch_size, pad_id=pad, eos_id=eos, deadline_s=1e9,
                                  desc="teacher (validation)")
        train, used = teacher_generate(teacher, train_prompts, max_new_tokens=args.max_new_tokens,
                                       batch_size=args.batch_size, pad_id=pad, eos_id=eos,
                                       deadline_s=args.gen_minutes * 60, desc="teacher (train)")
        meta = {
            "datasets": {n: DATASETS[n] for n in names}, "chat_template": True, "max_new_tokens": args.max_new_tokens,
            "validation_prompt_range": [BENCH_PROMPTS, val_stop], "train_prompt_start": val_stop,
            "generated_prompts": used, "train_examples": len(train), "validation_examples": len(val),
            "train_tokens": sum(len(e.tokens) for e in train),
            "train_continuation_tokens": sum(len(e.tokens) - e.prompt_len for e in train),
        }
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"train": train, "val": val, "meta": meta}, cache)
    if prompt_cache.exists() and not args.regenerate:
        extra = torch.load(prompt_cache, weights_only=False)
    else:
        leftover = train_prompts[meta.get("generated_prompts", len(train)) :][: args.label_prompts]
        extra = label_prompts(teacher, leftover, batch_size=args.batch_size, pad_id=pad,
                              desc="teacher (prompt-only labels)")
        torch.save(extra, prompt_cache)
    meta["prompt_only_examples"] = len(extra)
    meta["prompt_only_tokens"] = sum(len(e.tokens) for e in extra)
    return train + extra, val, meta


def evaluate(model, val: list[Example], k: int) -> dict:
    return replay_acceptance(TorchEngine(model, max_sequences=2), val, k).as_dict()


def distill_one(name: str, teacher, layers: list[int], vocab, train: list[Example], val: list[Example], cfg: TrainConfig,
                weights, meta: dict, out: Path, k: int) -> DistilledDraftModel:
    model = DistilledDraftModel.from_teacher(teacher, layers, vocab)
    report = train_draft(model, train, cfg, weights, desc=f"train {name}", validation=val)
    quality = evaluate(model, val, k)
    manifest = {
        "name": name, "engine": "distilled", "teacher": meta.get("teacher"), "layers_from_teacher": layers,
        "reduced_vocab": int(vocab.numel()), "vocab_coverage_validation": round(vocab_coverage(val, vocab), 4),
        "data": meta, "train": {**asdict(cfg), **asdict(report)}, "validation": quality,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    model.save(out / name, manifest)
    log.info("%s: acceptance@%d %.3f, %.2f ms/draft token, %d steps", name, k, quality["acceptance"], quality["ms_per_draft_token"], report.steps)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=os.environ.get("DEPLOY", str(ROOT / "deploy.yaml")))
    p.add_argument("--gen-minutes", type=float, default=10.0, help="time budget for the LLM's training continuations")
    p.add_argument("--train-minutes", type=float, nargs=2, default=[12.0, 14.0], help="budgets of ssm_d2 and ssm_d4b")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--val-per-dataset", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8192, help="reduced head size (most frequent teacher labels)")
    p.add_argument("--boost", type=float, default=2.0)
    p.add_argument("--k", type=int, default=4, help="draft length of the validation replay")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--label-prompts", type=int, default=2400, help="leftover training prompts labelled prompt-only")
    p.add_argument("--regenerate", action="store_true", help="regenerate the teacher data even if cached")
    p.add_argument("--evaluate-only", action="store_true",
                   help="only replay the validation split for the SSMs already built (e.g. on a quiet machine) and update their manifests")
    args = p.parse_args()
    require(chat_sets())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    dep = load_or_exit(args.deploy)
    teacher_dir = hf_dir_for(dep.llm["source"], dep)
    out = dep.cache_dir / "distill"
    teacher = load_causal_lm(str(teacher_dir))
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir, local_files_only=True)
    if args.evaluate_only:
        evaluate_existing(out, args.k, teacher)
        return
    train, val, meta = build_data(args, teacher, tokenizer, out)
    meta["teacher"] = str(teacher_dir)
    vocab = reduced_vocab(train, args.vocab, [tokenizer.eos_token_id])
    log.info("reduced vocabulary %d tokens covers %.2f%% of validation continuations", vocab.numel(), 100 * vocab_coverage(val, vocab))
    d2 = distill_one("ssm_d2", teacher, layers=[0, 1], vocab=vocab, train=train, val=val,
                     cfg=TrainConfig(args.train_minutes[0]), weights=None, meta=meta, out=out, k=args.k)
    weights = boost_weights(train, greedy_predictions(d2, train), args.boost)
    distill_one("ssm_d4b", teacher, layers=[0, 1, 2, 3], vocab=vocab, train=train, val=val,
                cfg=TrainConfig(args.train_minutes[1], boost=args.boost, seed=1), weights=weights, meta=meta, out=out,
                k=args.k)
    write_references(out, val, args.k, teacher)


def write_references(out: Path, val: list[Example], k: int, teacher) -> None:
    """What the distilled SSMs are compared with: llama.cpp's Q4_1 self-draft, and the full-vocabulary head."""
    summary = {"ssm_q4 (llama.cpp Q4_1, reference)": _llamacpp_reference(val, k),
               "ssm_d2 with the full 49152-token head (cost only)": _full_head_cost(teacher, val, k)}
    (out / "reference.json").write_text(json.dumps(summary, indent=2))
    log.info("references: %s", summary)


def evaluate_existing(out: Path, k: int, teacher) -> None:
    val = torch.load(out / "teacher_data.pt", weights_only=False)["val"]
    for name in ("ssm_d2", "ssm_d4b"):
        path = out / name
        if not is_distilled_dir(path):
            continue
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        manifest["validation"] = evaluate(load_draft_model(path), val, k)
        (path / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        log.info("%s: %s", name, manifest["validation"])
    write_references(out, val, k, teacher)


def _llamacpp_reference(val: list[Example], k: int) -> dict:
    from minions.engines.llamacpp_engine import LlamaCppEngine

    return replay_acceptance(LlamaCppEngine(str(smollm2_gguf()), 2, 2, 2048), val, k).as_dict()


def _full_head_cost(teacher, val: list[Example], k: int) -> dict:
    """Drafting cost of the same 2-layer model with a head over the whole vocabulary (untrained: cost only)."""
    full = DistilledDraftModel.from_teacher(teacher, [0, 1], torch.arange(teacher.config.vocab_size))
    return {"ms_per_draft_token": evaluate(full, val[:4], k)["ms_per_draft_token"]}


if __name__ == "__main__":
    exit_on_missing_set(main)
