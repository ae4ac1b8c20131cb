"""Prompt sets for the benchmarks, the load test and distillation: the sets the project ships (datasets/ in
the checkout: MT-bench, code edits, passages) and, where a folder beside it holds them, larger ones that
it may not ship (datasets/README.md says which is which). The tests do not need them.

A set's file is looked for in MINIONS_DATASETS (default: ../shared/datasets beside the checkout), then in
datasets/; a set found in neither raises MissingPromptSet, whose message is the line a tool prints."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[3]
SHIPPED_DATASETS = ROOT / "datasets"
"""The sets that ship with the project."""
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"
"""Beside the project's checkout, where present; MINIONS_DATASETS overrides."""

DATASETS = {
    "finance": "finance_alpaca.jsonl",
    "dialogue": "empathetic_dialogues.jsonl",
    "alpaca": "alpaca.jsonl",
    "mt_bench": "mt_bench_question.jsonl",
}
"""Every chat set, mixed by the load benchmarks when asked for (chat_sets)."""
COPY_HEAVY = {
    "code_edit": "code_edit.jsonl",
    "passages": "passages.jsonl",
    "summarization": "summarization.jsonl",
}
"""Sets whose answers copy from the prompt (whole files, texts to summarise): separate workloads, never mixed in."""
SHIPPED = ("mt_bench", "code_edit", "passages")
"""The sets in datasets/, which every clone has."""
DEFAULT_CHAT_SETS = ("mt_bench",)
"""The chat mix unless MINIONS_CHAT_SETS names another."""
DEFAULT_COPY_HEAVY = ("code_edit", "passages")
"""The copy-heavy workloads a benchmark runs unless asked for others."""
CHAT_SETS_VAR = "MINIONS_CHAT_SETS"


WARM_UP = ("Hello! What can you help me with today?", "Write two sentences about the sea.",
           "Name three colours and one thing of each colour.", "What is 17 times 3? Answer briefly.")
"""Prompts that no set holds, for the requests that pay a server's one-off costs before a measurement:
no cell then meets a prompt (or an answer) that the warm-up left in a cache or a drafter's corpus."""


class MissingPromptSet(LookupError):
    """A set that was asked for is in none of the folders looked in (or has no such name)."""


def datasets_dir() -> Path:
    """The folder of the larger sets: MINIONS_DATASETS, else ../shared/datasets."""
    return Path(os.environ.get("MINIONS_DATASETS", SHARED_DATASETS))


def set_path(name: str) -> Path:
    """The file a set is read from: datasets_dir()'s, else the shipped copy."""
    files = DATASETS | COPY_HEAVY
    if name not in files:
        raise MissingPromptSet(f"no prompt set is named {name!r}; the sets: {', '.join(files)}")
    folders = [datasets_dir()] + ([SHIPPED_DATASETS] if name in SHIPPED else [])
    for folder in folders:
        if (folder / files[name]).is_file():
            return folder / files[name]
    raise MissingPromptSet(
        f"prompt set {name!r} ({files[name]}) is not in {datasets_dir()} and does not ship with Minions (its "
        f"sets: {', '.join(SHIPPED)}): set MINIONS_DATASETS to the folder that holds it, or ask for shipped sets "
        f"only (--datasets, {CHAT_SETS_VAR})")


def chat_sets() -> list[str]:
    """The chat sets a mix takes by default: MINIONS_CHAT_SETS (comma-separated), else the shipped ones."""
    names = [n.strip() for n in os.environ.get(CHAT_SETS_VAR, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise MissingPromptSet(f"{CHAT_SETS_VAR} names {', '.join(unknown)}, not chat sets ({', '.join(DATASETS)})")
    return names or list(DEFAULT_CHAT_SETS)


def named_sets(text: str) -> list[str]:
    """Comma-separated set names (a tool's --datasets); empty: chat_sets()."""
    return [n.strip() for n in text.split(",") if n.strip()] or chat_sets()


def require(names: Iterable[str]) -> None:
    """Raise MissingPromptSet for the first of `names` that cannot be read: a tool calls this before it
    starts a server, so that a missing set costs one line, not a run."""
    for name in names:
        set_path(name)


def load_prompts(name: str, count: int, offset: int = 0) -> list[str]:
    """`count` prompts of a dataset from its `offset`-th on (MT-bench: the first turn of each question)."""
    return [turns[0] for turns in load_turns(name, count, offset)]


def load_turns(name: str, count: int, offset: int = 0) -> list[list[str]]:
    """The user turns of `count` rows of a dataset from its `offset`-th on: MT-bench's two, else the prompt alone."""
    rows = []
    with set_path(name).open() as f:
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
    `count` at most), then each other chat set of the mix as one category (`count` prompts from its
    `offset`-th)."""
    by_category: dict[str, list[str]] = {}
    with set_path("mt_bench").open() as f:
        for line in f:
            row = json.loads(line)
            questions = by_category.setdefault(f"mt_bench/{row.get('category', 'general')}", [])
            if len(questions) < count and row["turns"][0].strip():
                questions.append(row["turns"][0])
    return by_category | {name: load_prompts(name, count, offset) for name in chat_sets() if name != "mt_bench"}


def mixed_prompts(count: int, datasets: list[str] | None = None, offset: int = 0) -> list[str]:
    """count prompts taken in turn from each dataset (default: chat_sets()), starting at each one's
    prompt `offset`; fewer when the sets run out."""
    names = datasets or chat_sets()
    per = -(-count // len(names))
    pools = [load_prompts(name, per, offset) for name in names]
    interleaved = [pool[i] for i in range(per) for pool in pools if i < len(pool)]
    return interleaved[:count]


def warm_up_prompts(count: int) -> list[str]:
    """`count` warm-up prompts (WARM_UP, cycled)."""
    return [WARM_UP[i % len(WARM_UP)] for i in range(count)]


T = TypeVar("T")


def exit_on_missing_set(main: Callable[[], T]) -> T:
    """Run a command's main; a missing prompt set ends it with its one line on stderr and exit code 2."""
    try:
        return main()
    except MissingPromptSet as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
