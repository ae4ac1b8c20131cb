"""Deployments for benchmarks that send the same prompts through several modes.

A mode that replays a prompt after another must not profit from the one before it: the suffix
drafter's corpus of finished requests would hold the answer just given (greedy answers are equal, so
it drafts the whole of it), and the engines' prefix caches would hold the prompt just prefilled.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from minions.settings import PREFIX_CACHING_ENGINES


def replay_deployment(source: Path, target: Path, *, prefix_caching: bool = True) -> Path:
    """`source` written to `target` with the suffix drafter's cross-request corpus off, the llama.cpp
    and torch engines' prefix caches off unless `prefix_caching` (for modes that share one server), and the model
    cache where `source` keeps it. The source file is left as it was."""
    raw = yaml.safe_load(source.read_text())
    raw["cache_dir"] = str((source.parent / raw.get("cache_dir", ".cache/minions")).resolve())
    for entry in [raw["llm"], *raw.get("ssms", [])]:
        if entry.get("engine") == "suffix":
            entry["suffix_corpus_tokens"] = 0
        if entry.get("engine") in PREFIX_CACHING_ENGINES and not prefix_caching:
            entry["prefix_caching"] = False
    target.write_text(yaml.safe_dump(raw, sort_keys=False))
    return target
