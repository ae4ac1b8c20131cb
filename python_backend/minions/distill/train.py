"""Training a distilled SSM on teacher labels, within a wall-clock budget, on CPU.

The embeddings stay frozen (they are the LLM's and most of the parameters); the layers, final norm
and reduced head learn to predict the LLM's greedy token. The learning rate follows a cosine over the
time budget rather than a step count, so a slower machine trains fewer steps instead of overrunning.
A few hundred generated examples are memorised within minutes (the first run reached a training loss
of 0.2 and 11% validation acceptance), so the loss on the validation split is checked every
`eval_every_s` and the best weights are the ones kept.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from tqdm import tqdm

from .teacher_data import Example


@dataclass
class TrainConfig:
    minutes: float
    batch_size: int = 8
    lr: float = 5e-4
    warmup_steps: int = 20
    prompt_weight: float = 0.3
    """Loss weight of prompt positions (drafting happens on continuations; prompts are extra signal)."""
    boost: float = 0.0
    """Extra loss weight on positions another SSM gets wrong ("boost-tuning"; 0 = plain)."""
    max_len: int = 320
    seed: int = 0
    eval_every_s: float = 45.0
    max_steps: int | None = None
    """Stop after this many steps even if time is left (reproducible runs, tests)."""


@dataclass
class TrainReport:
    steps: int
    tokens: int
    seconds: float
    final_loss: float
    best_validation_loss: float | None = None
    best_step: int | None = None


def reduced_vocab(examples: list[Example], size: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent teacher labels and input tokens (answers often copy the prompt's
    words), plus `always` (e.g. the end token), sorted by id."""
    counts = Counter(t for e in examples for t in e.labels)
    counts.update(t for e in examples for t in e.tokens)
    chosen = set(always) | {t for t, _ in counts.most_common(max(size - len(always), 0))}
    return torch.tensor(sorted(chosen), dtype=torch.long)


def vocab_coverage(examples: list[Example], vocab: torch.Tensor) -> float:
    """Share of continuation labels the reduced head can produce at all."""
    allowed = set(vocab.tolist())
    labels = [t for e in examples for t in e.labels[e.prompt_len - 1 :]]
    return sum(t in allowed for t in labels) / max(len(labels), 1)


def _batch(examples: list[Example], weights: list[list[float]] | None, index: list[int], cfg: TrainConfig, to_sub: torch.Tensor):
    rows = [examples[i] for i in index]
    width = min(max(len(e.tokens) for e in rows), cfg.max_len)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    target = torch.full((len(rows), width), -100, dtype=torch.long)
    weight = torch.zeros(len(rows), width)
    for r, (i, e) in enumerate(zip(index, rows, strict=True)):
        n = min(len(e.tokens), width)
        ids[r, :n] = torch.tensor(e.tokens[:n])
        mask[r, :n] = 1
        target[r, :n] = to_sub[torch.tensor(e.labels[:n])]
        w = torch.full((n,), 1.0)
        w[: max(e.prompt_len - 1, 0)] = cfg.prompt_weight
        if weights is not None:
            w *= torch.tensor(weights[i][:n])
        weight[r, :n] = w
    weight[target < 0] = 0.0
    return ids, mask, target.clamp(min=0), weight


def validation_loss(model, examples: list[Example], to_sub: torch.Tensor, batch_size: int = 8) -> float:
    """Mean cross-entropy on the continuation positions (where drafting happens)."""
    cfg = TrainConfig(minutes=0, prompt_weight=0.0)
    total = weight_sum = 0.0
    model.eval()
    with torch.no_grad():
        for lo in range(0, len(examples), batch_size):
            index = list(range(lo, min(lo + batch_size, len(examples))))
            ids, mask, target, weight = _batch(examples, None, index=index, cfg=cfg, to_sub=to_sub)
            logits = model.sub_logits(ids, attention_mask=mask)
            per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
            total += float((per_token * weight.flatten()).sum())
            weight_sum += float(weight.sum())
    model.train()
    return total / max(weight_sum, 1e-9)


def train_draft(model, examples: list[Example], cfg: TrainConfig, weights: list[list[float]] | None = None,
                desc: str = "train", validation: list[Example] | None = None) -> TrainReport:
    """Train in place until cfg.minutes have passed (keeping the weights best on `validation`)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model.train()
    model.model.embed_tokens.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    to_sub = torch.full((model.config.vocab_size,), -100, dtype=torch.long)
    to_sub[model.vocab] = torch.arange(model.vocab.numel())
    budget = cfg.minutes * 60.0
    start = time.monotonic()
    steps = tokens = 0
    loss_ema = float("nan")
    bar = tqdm(total=int(budget), desc=desc, unit="s", bar_format="{l_bar}{bar}| {n}/{total} s {postfix}")
    order: list[int] = []
    best: tuple[float, int, dict] | None = None
    next_eval = cfg.eval_every_s
    while (elapsed := time.monotonic() - start) < budget and (cfg.max_steps is None or steps < cfg.max_steps):
        progress = max(elapsed / budget, steps / cfg.max_steps if cfg.max_steps else 0.0)
        if validation and elapsed >= next_eval:
            best = _keep_best(model, validation, to_sub=to_sub, step=steps, best=best)
            next_eval = elapsed + cfg.eval_every_s
        if not order:
            order = list(range(len(examples)))
            rng.shuffle(order)
        index, order = order[: cfg.batch_size], order[cfg.batch_size :]
        ids, mask, target, weight = _batch(examples, weights, index=index, cfg=cfg, to_sub=to_sub)
        scale = min(1.0, (steps + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * max(scale, 0.05)
        logits = model.sub_logits(ids, attention_mask=mask)
        per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
        loss = (per_token * weight.flatten()).sum() / weight.sum().clamp(min=1e-6)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        steps += 1
        tokens += int(mask.sum())
        value = loss.item()
        loss_ema = value if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * value
        bar.n = min(int(time.monotonic() - start), int(budget))
        bar.set_postfix_str(f"step {steps} loss {loss_ema:.3f}")
    bar.close()
    seconds = time.monotonic() - start
    if validation:
        best = _keep_best(model, validation, to_sub=to_sub, step=steps, best=best)
        model.load_state_dict(best[2], strict=False)
    model.eval()
    return TrainReport(steps, tokens, seconds=seconds, final_loss=loss_ema,
                       best_validation_loss=best[0] if best else None, best_step=best[1] if best else None)


def _keep_best(model, validation: list[Example], to_sub: torch.Tensor, step: int, best):
    loss = validation_loss(model, validation, to_sub)
    if best is None or loss < best[0]:
        trainable = {k: v.detach().clone() for k, v in model.state_dict().items() if "embed_tokens" not in k}
        return (loss, step, trainable)
    return best


def greedy_predictions(model, examples: list[Example], batch_size: int = 8) -> list[list[int]]:
    """The draft model's argmax (full-vocabulary ids) at every position of every example."""
    out: list[list[int]] = []
    with torch.inference_mode():
        for lo in range(0, len(examples), batch_size):
            rows = examples[lo : lo + batch_size]
            width = max(len(e.tokens) for e in rows)
            ids = torch.tensor([e.tokens + [0] * (width - len(e.tokens)) for e in rows], dtype=torch.long)
            mask = torch.tensor([[1] * len(e.tokens) + [0] * (width - len(e.tokens)) for e in rows], dtype=torch.long)
            best = model.vocab[model.sub_logits(ids, attention_mask=mask).argmax(-1)]
            out += [best[r, : len(e.tokens)].tolist() for r, e in enumerate(rows)]
    return out


def boost_weights(examples: list[Example], predictions: list[list[int]], boost: float) -> list[list[float]]:
    """Per-position weights 1 + boost where the other model's prediction misses the teacher's label."""
    return [
        [1.0 + boost * (p != t) for p, t in zip(pred, e.labels, strict=True)]
        for e, pred in zip(examples, predictions, strict=True)
    ]
