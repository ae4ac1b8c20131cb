"""The orchestrator's decoding loop, free of Triton so it can be tested against in-process engines.

One round: the chosen SSM drafts k tokens from the whole sequence; the LLM verifies them and returns
the accepted prefix plus one token of its own. With speculation `off` the LLM is called with no draft
and returns one token, which is plain decoding through the very same engine and path. The loop
resends the whole sequence every round (engines keep their own prefix KV caches) and releases every
engine's cached state for the request when it ends, however it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .bad_words import BadWords
from .engine_api import EngineRequest, EngineResult
from .generation_request import SPECULATION_OFF, Speculation
from .sampling import GREEDY, SamplingParams
from .sequence_cache import common_prefix_len
from .ssm_health import SsmHealth

log = logging.getLogger("minions.decode")


class EngineClient(Protocol):
    """How the loop reaches engine models (Triton BLS calls in production, objects in tests)."""

    async def generate(self, model: str, request: EngineRequest) -> EngineResult: ...

    async def release(self, model: str, request_id: str) -> None: ...


@dataclass
class DecodePlan:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    seed: int | None = None
    end_id: int | None = None
    bad_words: BadWords = field(default_factory=lambda: BadWords([]))
    speculation: Speculation = field(default_factory=lambda: Speculation(SPECULATION_OFF))
    num_draft_tokens: int = 4
    llm: str = "llm"
    use_draft_logits: bool = False
    """When sampling: the SSM samples its draft with the request's parameters and sends its logits,
    and the LLM verifies with the min(1, p/q) rule (ignored for greedy decoding and for SSMs that
    have no logits, whose drafts are then judged as deterministic)."""
    health: SsmHealth = field(default_factory=SsmHealth)
    """Shared across requests in the server, so a dead SSM is skipped by everyone."""


@dataclass
class Round:
    tokens: list[int]
    ssm: str | None
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    ssm_failed: str | None = None
    """Name of the SSM that failed to draft this round (the round went on without a draft)."""
    last: bool = False
    """No round follows (max_new_tokens or end_id reached): the consumer can finish its stream
    before the generator's clean-up releases the engines' state."""


@dataclass
class DecodeStats:
    """What a request's speculation achieved; mirrors TensorRT-LLM's perf-metric outputs."""

    verifications: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, r: Round) -> None:
        self.verifications += 1
        self.emitted_tokens += len(r.tokens)
        self.draft_seconds += r.draft_seconds
        self.verify_seconds += r.verify_seconds
        if r.drafted:
            self.drafts += 1
            self.draft_tokens += r.drafted
            self.accepted_tokens += r.accepted
            if len(self.accepted_per_position) < r.drafted:
                self.accepted_per_position += [0] * (r.drafted - len(self.accepted_per_position))
            for pos in range(r.accepted):
                self.accepted_per_position[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


def round_seed(seed: int, position: int, stream: int = 0) -> int:
    """A per-round seed from the request's seed and the sequence length (reproducible); `stream`
    keeps the SSM's draws independent of the LLM's."""
    return int(np.random.SeedSequence([seed, position, stream]).generate_state(1, np.uint64)[0])


async def speculative_decode(client: EngineClient, plan: DecodePlan, request_id: str) -> AsyncIterator[Round]:
    """Yield one Round per LLM verification until max_new_tokens or end_id; release caches at the end.

    Close the generator (e.g. with contextlib.aclosing) to stop early: the finally clause frees the
    engines' state for this request.
    """
    sequence = list(plan.prompt_ids)
    seed = plan.seed if plan.seed is not None else int(np.random.default_rng().integers(2**62))
    ssm = plan.speculation.ssms[0] if plan.speculation.mode != SPECULATION_OFF else None
    used = [plan.llm] + ([ssm] if ssm else [])
    produced = 0
    sampled_drafts = plan.use_draft_logits and not plan.sampling.greedy
    try:
        while produced < plan.max_new_tokens:
            remaining = plan.max_new_tokens - produced
            # The first round is plain decoding: the first token then costs one LLM prefill, as in
            # `off` (TTFT), instead of waiting for the SSM's prefill and draft as well.
            k = min(plan.num_draft_tokens, remaining - 1) if ssm and produced > 0 else 0
            if k > 0 and not plan.health.available(ssm):
                k = 0  # the SSM is failing: verify without a draft, i.e. plain decoding
            draft: list[int] = []
            draft_logits = None
            failed = None
            t0 = time.perf_counter()
            if k > 0:
                try:
                    proposal = await client.generate(
                        ssm,
                        EngineRequest(
                            request_id,
                            list(sequence),
                            k,
                            sampling=plan.sampling if sampled_drafts else GREEDY,
                            seed=round_seed(seed, len(sequence), stream=1) if sampled_drafts else None,
                            return_generation_logits=sampled_drafts,
                            exclude_input_in_output=True,
                        ),
                    )
                    draft = proposal.tokens[:k]
                    if draft and sampled_drafts and proposal.logits is not None:
                        draft_logits = proposal.logits[: len(draft)]
                    plan.health.succeeded(ssm)
                except Exception as exc:  # a request never fails because of an SSM: verify without a draft
                    failed = ssm
                    log.warning("%s: SSM %s failed: %s", request_id, ssm, exc)
                    if plan.health.failed(ssm):
                        log.warning("SSM %s skipped by all requests for %.0f s", ssm, plan.health.cooldown_s)
            t1 = time.perf_counter()
            verdict = await client.generate(
                plan.llm,
                EngineRequest(
                    request_id,
                    list(sequence),
                    len(draft) + 1,
                    draft=draft,
                    draft_logits=draft_logits,
                    sampling=plan.sampling,
                    seed=round_seed(seed, len(sequence)),
                    end_id=plan.end_id,
                    bad_words=plan.bad_words,
                    exclude_input_in_output=True,
                ),
            )
            t2 = time.perf_counter()
            new = verdict.tokens[:remaining]
            if not new:
                raise RuntimeError(f"engine {plan.llm!r} returned no token")
            sequence += new
            produced += len(new)
            # TensorRT-LLM returns tokens only: the accepted count is the prefix shared with the draft.
            accepted = common_prefix_len(new, draft)
            last = produced >= plan.max_new_tokens or (plan.end_id is not None and plan.end_id in new)
            yield Round(new, ssm if draft else None, len(draft), accepted, t1 - t0, t2 - t1, failed, last)
            if last:
                return
    finally:
        for model in used:
            if model == plan.llm or plan.health.available(model):  # a dead stub would stall the release
                await client.release(model, request_id)
