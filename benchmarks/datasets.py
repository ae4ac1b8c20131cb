"""Prompt sets from ../shared/datasets (read in place, never copied into the project)."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {
    "finance": "finance_alpaca.jsonl",
    "dialogue": "empathetic_dialogues.jsonl",
    "alpaca": "alpaca.jsonl",
    "mt_bench": "mt_bench_question.jsonl",
}


def datasets_dir() -> Path:
    return Path(os.environ.get("MINIONS_DATASETS", ROOT.parent / "shared" / "datasets"))


def load_prompts(name: str, count: int, offset: int = 0) -> list[str]:
    """The first `count` prompts of a dataset (MT-bench: the first turn of each question)."""
    path = datasets_dir() / DATASETS[name]
    prompts = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            text = row["turns"][0] if "turns" in row else row["prompt"]
            if text.strip():
                prompts.append(text)
            if len(prompts) >= offset + count:
                break
    return prompts[offset:]
