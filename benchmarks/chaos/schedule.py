"""The faults of a chaos run: their kinds, the deck of every (kind, model) pair, and the order and gaps
a seed deals them in."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

FAULT_KINDS = ("ssm_kill", "llm_kill", "minions_kill", "reload")


# -- the pure parts: schedule, outcomes, memory, problems ----------------------------------------------
@dataclass(frozen=True)
class Fault:
    kind: str
    model: str
    gap_s: float
    """Seconds to wait, after the previous fault has settled, before this one."""


def parse_faults(text: str) -> tuple[str, ...]:
    """`ssm_kill,reload` -> the kinds, in FAULT_KINDS order; ValueError naming an unknown one."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kind(s) {unknown or text!r}: choose from {','.join(FAULT_KINDS)}")
    return tuple(k for k in FAULT_KINDS if k in kinds)


def fault_deck(kinds: Iterable[str], llm: str, orchestrator: str, ssms: Sequence[str]) -> list[tuple[str, str]]:
    """Every (kind, model) pair the kinds stand for: a kill per SSM, the LLM's, the orchestrator's, and a
    reload of each model."""
    targets = {"ssm_kill": list(ssms), "llm_kill": [llm], "minions_kill": [orchestrator],
               "reload": [llm, orchestrator, *ssms]}
    return [(kind, model) for kind in kinds for model in targets[kind]]


def fault_schedule(seed: int, deck: Sequence[tuple[str, str]], min_gap_s: float, max_gap_s: float) -> Iterator[Fault]:
    """Faults without end, from `seed` alone: the deck dealt in a shuffled order, reshuffled once dealt
    (every pair comes once before any comes again), each with a gap drawn uniformly from the range. The
    first deal opens with one fault of each kind, so a run long enough for that many faults meets
    every kind, however slowly the machine recovers from them."""
    if not deck:
        raise ValueError("no fault to inject")
    rng = random.Random(seed)
    first = True
    while True:
        order = list(deck)
        rng.shuffle(order)
        if first:
            order, first = _each_kind_first(order), False
        for kind, model in order:
            yield Fault(kind, model, round(rng.uniform(min_gap_s, max_gap_s), 3))


def _each_kind_first(order: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`order` with each kind's first pair moved to the front, in their order."""
    openers: dict[str, tuple[str, str]] = {}
    for kind, model in order:
        openers.setdefault(kind, (kind, model))
    return [*openers.values(), *(pair for pair in order if pair not in openers.values())]
