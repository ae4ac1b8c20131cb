"""Prompt-set files in the format minions.text.datasets reads, for tests that run the tools which
read them (bench-peers' prompt assignment, the load test): the tests need nothing outside the project."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from minions.text.datasets import COPY_HEAVY, DATASETS


def write_prompt_sets(folder: Path, prompts: Mapping[str, list[str]]) -> None:
    """One file per named set in `folder` (MT-bench's rows hold `turns`, the others' a `prompt`)."""
    for name, texts in prompts.items():
        rows = [{"turns": [t]} if name == "mt_bench" else {"prompt": t} for t in texts]
        (folder / (DATASETS | COPY_HEAVY)[name]).write_text("".join(json.dumps(row) + "\n" for row in rows))
