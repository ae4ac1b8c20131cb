"""How well a draft engine would do as an SSM: greedy acceptance at k and drafting cost per token.

It replays speculative rounds against the LLM's known greedy continuation: draft k tokens from the
true prefix, accept the longest matching prefix, move on by accepted + 1 (the LLM's own token), as
the orchestrator does. Any engine of minions.engines works (distilled, llama.cpp, n-gram).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from minions.decoding.engine_call import EngineRequest
from minions.decoding.tokens import common_prefix_len
from minions.engines.api import Engine

from .teacher_data import Example


@dataclass
class DraftQuality:
    k: int
    rounds: int
    drafted: int
    accepted: int
    draft_seconds: float

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def ms_per_draft_token(self) -> float:
        return 1000.0 * self.draft_seconds / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        return {
            "k": self.k, "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4), "ms_per_draft_token": round(self.ms_per_draft_token, 3),
        }


def replay_acceptance(engine: Engine, examples: list[Example], k: int) -> DraftQuality:
    rounds = drafted = accepted = 0
    seconds = 0.0
    for n, e in enumerate(examples):
        rid = f"eval-{n}"
        pos = e.prompt_len
        while pos < len(e.tokens):
            n_draft = min(k, len(e.tokens) - pos)
            t0 = time.perf_counter()
            draft = engine.generate(EngineRequest(rid, e.tokens[:pos], n_draft, exclude_input_in_output=True)).tokens[:n_draft]
            seconds += time.perf_counter() - t0
            truth = e.tokens[pos : pos + n_draft]
            hit = common_prefix_len(draft, truth)
            rounds += 1
            drafted += len(draft)
            accepted += hit
            pos += hit + 1
        engine.release(rid)
    return DraftQuality(k, rounds, drafted=drafted, accepted=accepted, draft_seconds=seconds)
