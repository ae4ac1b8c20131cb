"""Prompt sets from ../shared/datasets (read in place, never copied into the project), for the benchmarks,
the load test and distillation; the tests do not need them."""

from __future__ import annotations

import json
import os
from pathlib import Path

DATASETS = {
    "finance": "finance_alpaca.jsonl",
    "dialogue": "empathetic_dialogues.jsonl",
    "alpaca": "alpaca.jsonl",
    "mt_bench": "mt_bench_question.jsonl",
}
"""The chat sets, mixed by the load benchmarks."""
COPY_HEAVY = {
    "code_edit": "code_edit.jsonl",
    "summarization": "summarization.jsonl",
}
"""Sets whose answers copy from the prompt (whole files, articles): separate workloads, never mixed in."""


SHARED_DATASETS = Path(__file__).resolve().parents[4] / "shared" / "datasets"
"""Beside the project's checkout; MINIONS_DATASETS overrides."""


def datasets_dir() -> Path:
    return Path(os.environ.get("MINIONS_DATASETS", SHARED_DATASETS))


def load_prompts(name: str, count: int, offset: int = 0) -> list[str]:
    """`count` prompts of a dataset from its `offset`-th on (MT-bench: the first turn of each question)."""
    return [turns[0] for turns in load_turns(name, count, offset)]


def load_turns(name: str, count: int, offset: int = 0) -> list[list[str]]:
    """The user turns of `count` rows of a dataset from its `offset`-th on: MT-bench's two, else the prompt alone."""
    path = datasets_dir() / (DATASETS | COPY_HEAVY)[name]
    rows = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            turns = row["turns"] if "turns" in row else [row["prompt"]]
            if all(t.strip() for t in turns):
                rows.append(turns)
            if len(rows) >= offset + count:
                break
    return rows[offset:]


def category_prompts(count: int, offset: int) -> dict[str, list[str]]:
    """Prompts by category: MT-bench's first turns by its own categories (all of each one's questions,
    `count` at most), then each other chat set as one category (`count` prompts from its `offset`-th)."""
    by_category: dict[str, list[str]] = {}
    with (datasets_dir() / DATASETS["mt_bench"]).open() as f:
        for line in f:
            row = json.loads(line)
            questions = by_category.setdefault(f"mt_bench/{row.get('category', 'general')}", [])
            if len(questions) < count and row["turns"][0].strip():
                questions.append(row["turns"][0])
    return by_category | {name: load_prompts(name, count, offset) for name in DATASETS if name != "mt_bench"}


def mixed_prompts(count: int, datasets: list[str] | None = None, offset: int = 0) -> list[str]:
    """count prompts taken in turn from each dataset (default: finance, dialogue, alpaca, MT-bench),
    starting at each one's prompt `offset`; fewer when the sets run out."""
    names = datasets or list(DATASETS)
    per = -(-count // len(names))
    pools = [load_prompts(name, per, offset) for name in names]
    interleaved = [pool[i] for i in range(per) for pool in pools if i < len(pool)]
    return interleaved[:count]
