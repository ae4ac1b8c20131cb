"""Multi-turn workloads for bench-peers: conversations whose every turn re-sends the whole history, as a
chat client or a coding agent does, so that a server's prefix cache decides its time to first token.

- `multi_turn_chat`: MT-bench's two turns, then a third asking for a summary of the conversation;
- `multi_turn_code`: a code edit, then two more edits of the file the previous answer wrote out.
Each system answers with its own earlier answers in the history. `streams` threads each take the next
conversation and run its turns in order. Reported per turn: TTFT p50 and p99, the share of the prompts'
tokens the server said it found in its prefix cache, and the mean tokens/s of a turn's decode.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minions.text.datasets import load_turns

from ..workers import run_streams
from .streams import Sample

FOLLOW_UPS = {
    "multi_turn_chat": ("mt_bench", ["Summarise the conversation so far in two sentences."]),
    "multi_turn_code": ("code_edit", [
        "Now add a one-line docstring to every function and output the whole updated file.",
        "Now rename the variables to clearer names and output the whole updated file.",
    ]),
}
"""Workload: the prompt set its first turns come from, and the turns every conversation continues with."""
WORKLOADS = tuple(FOLLOW_UPS)

Converse = Callable[[list[dict]], Sample]
"""A system: the conversation so far (OpenAI chat messages, the last one the user's) in, its answer out."""


def conversations(workload: str, count: int, offset: int) -> list[list[str]]:
    """The user turns of `count` conversations of a workload, from the set's `offset`-th row on."""
    name, follow_ups = FOLLOW_UPS[workload]
    return [turns + follow_ups for turns in load_turns(name, count, offset)]


@dataclass
class ConversationCell:
    """One system on one multi-turn workload at one concurrency: samples by (conversation, turn)."""

    system: str
    workload: str
    streams: int
    wall_s: float = 0.0
    samples: dict[tuple[int, int], Sample] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def rows(self) -> list[dict]:
        turns = sorted({turn for _, turn in self.samples})
        out = []
        for turn in turns:
            samples = [s for (_, t), s in self.samples.items() if t == turn]
            ttfts = [s.ttft_s for s in samples]
            itls = [s.itl_s for s in samples if s.itl_s]
            prompt = sum(s.prompt_tokens for s in samples)
            out.append({"system": self.system, "workload": self.workload, "streams": self.streams, "turn": turn + 1,
                        "requests": len(samples), "ttft_p50_ms": 1000 * statistics.median(ttfts),
                        "ttft_p99_ms": 1000 * float(np.percentile(ttfts, 99)),
                        "cached_share": sum(s.cached_tokens for s in samples) / prompt if prompt else None,
                        "decode_tokens_per_s": 1 / statistics.mean(itls) if itls else None,
                        "errors": len(self.errors)})
        return out


def run_conversations(system: str, workload: str, converse: Converse, users: list[list[str]],
                      streams: int) -> ConversationCell:
    cell = ConversationCell(system, workload, streams)

    def one(turns: list[str]) -> list[Sample]:
        messages: list[dict] = []
        samples = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            sample = converse(list(messages))
            messages.append({"role": "assistant", "content": sample.text})
            samples.append(sample)
        return samples

    def done(i: int, samples: list[Sample]) -> None:
        for turn, sample in enumerate(samples):
            cell.samples[(i, turn)] = sample

    cell.wall_s = run_streams(users, streams, one, done, lambda exc: cell.errors.append(f"{type(exc).__name__}: {exc}"))
    return cell


def format_turns(rows: list[dict], reference: dict[tuple[str, int, int], dict]) -> str:
    """A markdown table of per-turn rows; `reference` maps (workload, streams, turn) to the plain
    llama-server row each is compared with."""
    lines = ["| workload | streams | system | turn | TTFT p50 ms | TTFT p99 ms | p50 vs llama-server | prompt cached "
             "| decode tok/s |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ref = reference.get((r["workload"], r["streams"], r["turn"]))
        ratio = f"{r['ttft_p50_ms'] / ref['ttft_p50_ms']:.2f}x" if ref else "-"
        decode = f"{r['decode_tokens_per_s']:.1f}" if r["decode_tokens_per_s"] else "-"
        cached = f"{r['cached_share']:.0%}" if r.get("cached_share") is not None else "-"
        lines.append(f"| {r['workload']} | {r['streams']} | {r['system']} | {r['turn']} | {r['ttft_p50_ms']:.0f} | "
                     f"{r['ttft_p99_ms']:.0f} | {ratio} | {cached} | {decode} |")
    return "\n".join(lines)


def messages_text(messages: list[dict]) -> str:
    """The chat input Minions takes for a conversation (a JSON list of messages; its chat template applies)."""
    return json.dumps(messages)

