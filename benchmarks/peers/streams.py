"""Concurrent streams against any server, and what a cell of them measured.

A system is reduced to one blocking call, prompt -> Sample, so that Minions and llama-server are
driven by the same code: `streams` threads pull the cell's prompts from one queue. ITL is taken per
request as (last token's time - first token's time) / (tokens - 1), which does not depend on how a
server chunks its stream (Minions sends a round's accepted tokens at once, llama-server one token
per event).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..workers import run_streams


@dataclass(frozen=True)
class Sample:
    """One finished request as its client saw it."""

    text: str
    tokens: int
    ttft_s: float
    last_token_s: float
    """Time from the request until the last output token arrived."""
    prompt_tokens: int = 0
    """The prompt's tokens as the server counted them (0 where it says nothing)."""
    cached_tokens: int = 0
    """Of those, the ones the server said it found in its prefix cache (0 where it says nothing)."""

    @property
    def itl_s(self) -> float | None:
        return (self.last_token_s - self.ttft_s) / (self.tokens - 1) if self.tokens > 1 else None


Request = Callable[[str], Sample]
"""A system: one prompt in, one finished request out (raises on failure)."""


@dataclass
class Cell:
    """One system on one workload at one concurrency."""

    system: str
    workload: str
    streams: int
    wall_s: float = 0.0
    samples: dict[int, Sample] = field(default_factory=dict)
    """By the prompt's index in the cell's prompt list."""
    errors: list[str] = field(default_factory=list)
    foreign_cores: float | None = None
    """Mean CPU cores that processes outside the benchmark used meanwhile (foreign_cpu.py)."""
    drafted_tokens: float | None = None
    """Draft tokens the server's LLM verified during the cell (Minions' metrics; None where the server
    says nothing): a default that verified none decoded as `off` does there."""

    def row(self) -> dict:
        samples = list(self.samples.values())
        tokens = sum(s.tokens for s in samples)
        ttfts = [s.ttft_s for s in samples]
        itls = [s.itl_s for s in samples if s.itl_s is not None]
        return {
            "system": self.system, "workload": self.workload, "streams": self.streams,
            "requests": len(samples), "tokens": tokens, "wall_s": self.wall_s,
            "tokens_per_s": tokens / self.wall_s if self.wall_s else 0.0,
            "ttft_mean_ms": 1000 * statistics.mean(ttfts) if ttfts else None,
            "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
            "ttft_p99_ms": 1000 * float(np.percentile(ttfts, 99)) if ttfts else None,
            "itl_ms": 1000 * statistics.mean(itls) if itls else None,
            "drafted_per_request": (self.drafted_tokens / len(samples)
                                    if self.drafted_tokens is not None and samples else None),
            "errors": len(self.errors), "foreign_cores": self.foreign_cores,
        }


def run_cell(system: str, workload: str, request: Request, prompts: list[str], streams: int,
             into: Cell | None = None, first: int = 0) -> Cell:
    """All prompts through `request` from `streams` threads; wall time from the first start to the last end.
    `into`: a cell run in slices, which this slice's wall time and samples (by index from `first`) join."""
    cell = into or Cell(system, workload, streams)

    def done(i: int, sample: Sample) -> None:
        cell.samples[first + i] = sample

    cell.wall_s += run_streams(prompts, streams, request, done,
                               lambda exc: cell.errors.append(f"{type(exc).__name__}: {exc}"))
    return cell
