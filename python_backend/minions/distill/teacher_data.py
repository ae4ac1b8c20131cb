"""Sequence-level distillation data: the LLM's own greedy continuations of real prompts.

Each example is prompt + continuation with a label per position: the LLM's argmax next token there.
On continuation positions that is the next token itself (the continuation is greedy); on prompt
positions it is what the LLM would have said instead, extra teacher signal at no generation cost.
Generating is the expensive part (about one prompt a second here), so prompts left over when the
generation budget runs out are still labelled, prompt-only, by one LLM forward each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm import tqdm


@dataclass
class Example:
    tokens: list[int]
    labels: list[int]
    """labels[i] = the LLM's greedy token after tokens[:i + 1]."""
    prompt_len: int


def teacher_generate(
    teacher, prompts: list[list[int]], max_new_tokens: int, batch_size: int, pad_id: int, eos_id: int | None,
    deadline_s: float, desc: str = "teacher",
) -> tuple[list[Example], int]:
    """Greedy continuations in left-padded batches until the prompts or the time budget run out;
    returns the examples and how many prompts were used."""
    examples: list[Example] = []
    used = 0
    start = time.monotonic()
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt")
    for lo in range(0, len(prompts), batch_size):
        if time.monotonic() - start > deadline_s:
            break
        batch = prompts[lo : lo + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], dtype=torch.long)
        with torch.inference_mode():
            out = teacher.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                pad_token_id=pad_id, eos_token_id=eos_id,
            )
        for prompt, row in zip(batch, out[:, width:].tolist(), strict=True):
            continuation = _until_eos(row, eos_id)
            if continuation:
                examples.append(Example(prompt + continuation, [], len(prompt)))
        used += len(batch)
        bar.update(len(batch))
    bar.close()
    label_examples(teacher, examples, batch_size=batch_size, pad_id=pad_id, desc=f"{desc}: labels")
    return examples, used


def label_prompts(teacher, prompts: list[list[int]], batch_size: int, pad_id: int, desc: str = "prompts") -> list[Example]:
    """Prompt-only examples: every position labelled by the LLM, the last one with its first reply token."""
    examples = [Example(list(p), [], len(p)) for p in prompts]
    label_examples(teacher, examples, batch_size=batch_size, pad_id=pad_id, desc=desc)
    return examples


def _until_eos(row: list[int], eos_id: int | None) -> list[int]:
    if eos_id is not None and eos_id in row:
        return row[: row.index(eos_id) + 1]
    return row


def label_examples(teacher, examples: list[Example], batch_size: int, pad_id: int, desc: str = "labels") -> None:
    """Fill each example's labels with the teacher's argmax at every position (right-padded batches)."""
    for lo in tqdm(range(0, len(examples), batch_size), desc=desc, unit="batch"):
        batch = examples[lo : lo + batch_size]
        width = max(len(e.tokens) for e in batch)
        ids = torch.tensor([e.tokens + [pad_id] * (width - len(e.tokens)) for e in batch], dtype=torch.long)
        mask = torch.tensor([[1] * len(e.tokens) + [0] * (width - len(e.tokens)) for e in batch], dtype=torch.long)
        with torch.inference_mode():
            argmax = teacher(input_ids=ids, attention_mask=mask).logits.argmax(-1).tolist()
        for e, row in zip(batch, argmax, strict=True):
            e.labels = row[: len(e.tokens)]
