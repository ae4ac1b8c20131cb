"""The orchestrator's decoding loop, free of Triton so it can be tested against in-process engines.

One round: a drafter (one SSM, a weighted vote of several, or a bandit's pick; see drafting.py)
proposes k tokens from the whole sequence; the LLM verifies them and returns the accepted prefix plus
one token of its own; the drafter learns from the outcome. With speculation `off` the LLM is called with no draft
and returns one token, which is plain decoding through the very same engine and path. The loop
resends the whole sequence every round (engines keep their own prefix KV caches) and releases every
engine's cached state for the request when it ends, however it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from .bad_words import BadWords
from .bandit import Ucb1
from .drafting import BanditDrafter, Drafter, DraftRound, EngineClient, Proposal, SingleDrafter, VoteDrafter
from .engine_api import EngineRequest
from .generation_request import SPECULATION_BANDIT, SPECULATION_OFF, SPECULATION_VOTE, Speculation
from .sampling import GREEDY, SamplingParams
from .sequence_cache import common_prefix_len
from .ssm_health import SsmHealth
from .ssm_weights import SsmWeights


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
    weights: SsmWeights | None = None
    """The vote's global SSM weights, shared across requests (None: fresh ones for this request)."""
    bandit: Ucb1 | None = None
    """The bandit policy, shared across requests (None: a fresh one for this request)."""
    vote_deadline_s: float = 0.5
    vote_explore_every: int = 8

    def drafter(self) -> Drafter | None:
        spec = self.speculation
        sampled = self.use_draft_logits and not self.sampling.greedy
        if spec.mode == SPECULATION_OFF or not spec.ssms:
            return None
        if spec.mode == SPECULATION_VOTE:
            weights = self.weights or SsmWeights(spec.ssms)
            return VoteDrafter(spec.ssms, self.health, weights, self.vote_deadline_s, self.vote_explore_every, sampled)
        if spec.mode == SPECULATION_BANDIT:
            return BanditDrafter(spec.ssms, self.health, self.bandit or Ucb1(spec.ssms), sampled)
        return SingleDrafter(spec.ssms[0], self.health, sampled)


@dataclass
class Round:
    tokens: list[int]
    ssm: str | None
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    failed: tuple[str, ...] = ()
    """SSMs that failed or missed the deadline this round (the round went on without them)."""
    last: bool = False
    """No round follows (max_new_tokens or end_id reached): the consumer can finish its stream
    before the generator's clean-up releases the engines' state."""
    drafts: dict[str, list[int]] = field(default_factory=dict)
    """Each SSM's own draft this round (several under a vote)."""
    control_seconds: float = 0.0
    """Time spent in voting, weight updates and SSM selection (not waiting for engines)."""

    def ssm_matched(self) -> dict[str, int]:
        """Per SSM: how many of its own draft tokens the LLM's output confirms."""
        return {ssm: common_prefix_len(d, self.tokens) for ssm, d in self.drafts.items()}


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
    control_seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, r: Round) -> None:
        self.verifications += 1
        self.emitted_tokens += len(r.tokens)
        self.draft_seconds += r.draft_seconds
        self.verify_seconds += r.verify_seconds
        self.control_seconds += r.control_seconds
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
    drafter = plan.drafter()
    produced = 0
    index = 0
    try:
        while produced < plan.max_new_tokens:
            remaining = plan.max_new_tokens - produced
            # The first round is plain decoding: the first token then costs one LLM prefill, as in
            # `off` (TTFT), instead of waiting for the SSMs' prefill and draft as well.
            k = min(plan.num_draft_tokens, remaining - 1) if drafter and produced > 0 else 0
            t0 = time.perf_counter()
            proposal = Proposal()
            if k > 0:
                proposal = await drafter.propose(client, DraftRound(
                    request_id, list(sequence), k, plan.sampling, round_seed(seed, len(sequence), stream=1), index,
                ))
            draft = proposal.draft[:k]
            t1 = time.perf_counter()
            verdict = await client.generate(
                plan.llm,
                EngineRequest(
                    request_id,
                    list(sequence),
                    len(draft) + 1,
                    draft=draft,
                    draft_logits=proposal.logits,
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
            index += 1
            control = proposal.control_seconds
            if k > 0:
                control += drafter.observe(proposal, new, t1 - t0, t2 - t1)
            # TensorRT-LLM returns tokens only: the accepted count is the prefix shared with the draft.
            accepted = common_prefix_len(new, draft)
            last = produced >= plan.max_new_tokens or (plan.end_id is not None and plan.end_id in new)
            yield Round(new, proposal.chosen if draft else None, len(draft), accepted, t1 - t0 - proposal.control_seconds,
                        t2 - t1, proposal.failed, last, proposal.drafts, control)
            if last:
                return
    finally:
        # Every engine, even an SSM whose breaker is open: one that was only slow still holds state.
        # Concurrently, so a dead stub's failing call (about 1 s) costs that once; this runs after
        # the request's final response has gone out.
        await asyncio.gather(*(client.release(m, request_id) for m in [plan.llm, *(drafter.ssms if drafter else ())]))
