"""The orchestrator's decoding loop, free of Triton so it can be tested against in-process engines.

One round: a drafter (one SSM, a weighted vote of several, or a bandit's pick; see drafting.py)
proposes k tokens from the whole sequence; the LLM verifies them and returns the accepted prefix plus
one token of its own; the drafter learns from the outcome. With speculation `off` the LLM is called with no draft
and returns one token, which is plain decoding through the very same engine and path. The loop
resends the whole sequence every round (engines keep their own prefix KV caches) and releases every
engine's cached state for the request when it ends, however it ends.

How many tokens to draft: a fixed `num_draft_tokens`, or (None) the adaptive selector of
draft_length.py, which may choose 0 (plain decoding) when speculation does not pay.

Pipelining: while the LLM verifies round r, the drafter already drafts round r+1 on the assumption
that the whole draft is accepted, from the sequence plus the draft, one token longer: its first
token guesses the LLM's own token. If verification accepts everything and the guess is right, the
rest is round r+1's draft, ready (or nearly) when verification ends; otherwise it is discarded. Both
the regular and the early draft hold a DraftPool slot until they reach the LLM, so drafting pauses
while a full LLM batch of drafts is waiting. Round 1 is plain decoding (the LLM's prefill); its early
draft, from the prompt alone, overlaps the SSMs' prompt prefill with the LLM's. Later early drafts are
made up to `pipeline_max_load` concurrent requests, and beyond that only while the selector expects
them to be used (`pipeline_min_hit`): a likely-wasted early draft takes SSM time that the other
requests' drafts wait for, a likely-used one only moves work the SSMs would do anyway off the
critical path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from .bad_words import BadWords
from .bandit import Ucb1
from .draft_length import DraftLengthSelector, SharedLengthStats
from .drafting import BanditDrafter, Drafter, DraftRound, EngineClient, Proposal, SingleDrafter, VoteDrafter
from .engine_api import EngineRequest
from .pipeline_pool import DraftPool, Slot
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
    num_draft_tokens: int | None = 4
    """Draft length per round; None: the adaptive selector chooses it (up to max_draft_tokens)."""
    max_draft_tokens: int = 8
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
    length_stats: SharedLengthStats | None = None
    """The adaptive selector's server-wide statistics (None: fresh ones for this request)."""
    pipeline: bool = False
    pipeline_max_load: int | None = None
    """Early drafts only while at most this many requests are being decoded (None: always), unless
    they will likely be used (pipeline_min_hit). Under load the other requests' drafts keep the SSMs
    busy while this one verifies, and an early draft, thrown away whenever the LLM rejects part of
    round r, takes SSM time they wait for."""
    pipeline_min_hit: float | None = 0.5
    """Above pipeline_max_load, early drafts are still made while the adaptive selector estimates at
    least this chance that one will be used (the whole draft accepted and the LLM's own token
    guessed): then the SSMs would draft the same tokens after verification anyway, only later.
    None: never above the load limit (nor for a fixed draft length, which has no estimate)."""
    pool: DraftPool | None = None
    """The server's intermediate draft pool (None: no throttle)."""
    load: Callable[[], int] = lambda: 1
    """How many requests are being decoded now (the batch size the LLM sees)."""

    def length_selector(self) -> DraftLengthSelector | None:
        if self.num_draft_tokens is not None:
            return None
        return DraftLengthSelector(self.length_stats or SharedLengthStats(), self.max_draft_tokens, self.pipeline)

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
    planned: int = 0
    """The draft length chosen for this round (the draft may be shorter: an SSM may stop early)."""
    pipelined: bool = False
    """The draft was made during the previous round's verification."""
    early_discarded: bool = False
    """An early draft for the next round was made during this round and thrown away."""

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
    planned_lengths: list[int] = field(default_factory=list)
    pipelined_drafts: int = 0
    discarded_early_drafts: int = 0

    def add(self, r: Round) -> None:
        self.verifications += 1
        self.planned_lengths.append(r.planned)
        self.pipelined_drafts += r.pipelined
        self.discarded_early_drafts += r.early_discarded
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


@dataclass
class _EarlyDraft:
    """A draft of round r+1 made during round r's verification, on the assumption that all of `assumed` passes."""

    task: asyncio.Task
    assumed: list[int]
    slot: Slot | None

    def discard(self) -> None:
        if self.slot is not None:
            self.slot.release()

    def holds(self, emitted: list[int]) -> bool:
        """Whether round r accepted all of the assumed draft (emitted = draft + the LLM's own token)."""
        return len(emitted) == len(self.assumed) + 1 and emitted[:-1] == self.assumed

    async def take(self, emitted: list[int]) -> Proposal | None:
        """Round r+1's proposal if the assumption held and the guess of the LLM's own token was right
        (the caller discards the early draft either way)."""
        if not self.holds(emitted):
            return None
        proposal = await self.task
        if not proposal.draft or proposal.draft[0] != emitted[-1]:
            return None
        proposal.draft = proposal.draft[1:]
        if proposal.logits is not None:
            proposal.logits = proposal.logits[1:]
        proposal.drafts = {ssm: d[1:] for ssm, d in proposal.drafts.items() if d[:1] == emitted[-1:]}
        return proposal


def _next_length(plan: DecodePlan, selector: DraftLengthSelector | None) -> int:
    """The draft length the next round will most likely ask for: the selector's held choice (it may
    still explore a neighbour), or the fixed length. An early draft is made at this length, not at the
    current draft's, or a pipeline whose early drafts keep passing would never take up a new choice."""
    return selector.current if selector is not None else plan.num_draft_tokens or 0


def _early_draft_pays(plan: DecodePlan, selector: DraftLengthSelector | None, batch: int, drafted: int) -> bool:
    """Whether to draft round r+1 during round r's verification of `drafted` tokens, at load `batch`."""
    if plan.pipeline_max_load is None or batch <= plan.pipeline_max_load:
        return True
    return (selector is not None and plan.pipeline_min_hit is not None
            and selector.survival(drafted + 1) >= plan.pipeline_min_hit)


async def _draft(drafter: Drafter, client: EngineClient, rnd: DraftRound, pool: DraftPool | None) -> tuple[Proposal, Slot | None]:
    """A regular draft, after waiting for a pool slot (held until the draft reaches the LLM)."""
    slot = await pool.acquire() if pool is not None else None
    try:
        return await drafter.propose(client, rnd), slot
    except BaseException:
        if slot is not None:
            slot.release()
        raise


async def speculative_decode(client: EngineClient, plan: DecodePlan, request_id: str) -> AsyncIterator[Round]:
    """Yield one Round per LLM verification until max_new_tokens or end_id; release caches at the end.

    Close the generator (e.g. with contextlib.aclosing) to stop early: the finally clause frees the
    engines' state for this request (after any early draft still running has finished).
    """
    sequence = list(plan.prompt_ids)
    seed = plan.seed if plan.seed is not None else int(np.random.default_rng().integers(2**62))
    drafter = plan.drafter()
    selector = plan.length_selector() if drafter else None
    produced = 0
    index = 0
    early: _EarlyDraft | None = None
    early_tasks: list[asyncio.Task] = []  # every early draft started, awaited before the engines' release
    last_emitted: list[int] = []
    drafted_before = False  # the first draft also pays the SSMs' prefill of the prompt
    slot: Slot | None = None
    try:
        while produced < plan.max_new_tokens:
            remaining = plan.max_new_tokens - produced
            batch = plan.load()
            # The first round is plain decoding: the first token then costs one LLM prefill, as in
            # `off` (TTFT), instead of waiting for the SSMs' prefill and draft as well.
            planned = 0
            if drafter and produced > 0:
                planned = selector.choose(batch) if selector else plan.num_draft_tokens
            k = min(planned, remaining - 1)
            t0 = time.perf_counter()
            proposal, pipelined = Proposal(), False
            if early is not None:
                taken = await early.take(last_emitted) if k > 0 else None
                early.discard()  # its pool slot: a taken draft reaches the LLM now, any other is dropped
                early = None
                if taken is not None:
                    proposal, pipelined = taken, True
            if k > 0 and not pipelined:
                proposal, slot = await _draft(drafter, client, DraftRound(
                    request_id, list(sequence), k, plan.sampling, round_seed(seed, len(sequence), stream=1), index,
                ), plan.pool)
            draft = proposal.draft[:k]
            if proposal.logits is not None:
                proposal.logits = proposal.logits[: len(draft)]
            t1 = time.perf_counter()
            if plan.length_stats is not None:  # every request, so the LLM batch's draft length is known
                # The first round is the prompt's prefill: as much LLM work as a draft of the prompt's length.
                plan.length_stats.report(request_id, len(draft) if produced else len(sequence) - 1)
            verification = asyncio.ensure_future(client.generate(
                plan.llm,
                EngineRequest(
                    request_id,
                    list(sequence),
                    len(draft) + 1,
                    draft=draft,
                    draft_logits=proposal.logits if draft else None,
                    sampling=plan.sampling,
                    seed=round_seed(seed, len(sequence)),
                    end_id=plan.end_id,
                    bad_words=plan.bad_words,
                    exclude_input_in_output=True,
                ),
            ))
            if slot is not None:  # the draft has reached the LLM: it no longer waits in the pool
                slot.release()
                slot = None
            # Round 1 (plain decoding, no draft) drafts round 2 from the prompt at any load: that moves
            # the SSMs' prompt prefill, which every request pays, off the critical path. The early draft
            # is one token longer than the next round's: its first token guesses the LLM's own.
            left_after = remaining - len(draft) - 1  # if this round accepts everything
            early_len = min(_next_length(plan, selector), left_after - 1) + 1 if drafter and (
                draft or produced == 0) else 0
            if plan.pipeline and early_len > 1 and (produced == 0 or _early_draft_pays(plan, selector, batch, len(draft))):
                early_slot = plan.pool.try_acquire() if plan.pool is not None else None
                if plan.pool is None or early_slot is not None:
                    assumed = sequence + draft
                    early = _EarlyDraft(asyncio.ensure_future(drafter.propose(client, DraftRound(
                        request_id, assumed, early_len, plan.sampling,
                        round_seed(seed, len(assumed), stream=1), index + 1,
                    ))), list(draft), early_slot)
                    early_tasks = [t for t in early_tasks if not t.done()] + [early.task]
            verdict = await verification
            t2 = time.perf_counter()
            new = verdict.tokens[:remaining]
            if not new:
                raise RuntimeError(f"engine {plan.llm!r} returned no token")
            sequence += new
            produced += len(new)
            index += 1
            last_emitted = new
            control = proposal.control_seconds
            draft_seconds = t1 - t0 - proposal.control_seconds
            if k > 0:
                control += drafter.observe(proposal, new, draft_seconds, t2 - t1)
            # TensorRT-LLM returns tokens only: the accepted count is the prefix shared with the draft.
            accepted = common_prefix_len(new, draft)
            if index > 1:  # round 1 is the prompt's prefill, not a verification
                measured = draft_seconds if drafted_before else None
                if selector is not None:
                    selector.observe(batch, len(draft), accepted, measured, t2 - t1)
                elif plan.length_stats is not None:  # fixed lengths and plain decoding measure the LLM too
                    plan.length_stats.observe(batch, plan.pipeline, len(draft), accepted, measured, t2 - t1)
            drafted_before = drafted_before or bool(draft)
            last = produced >= plan.max_new_tokens or (plan.end_id is not None and plan.end_id in new)
            discarded = early is not None and not early.holds(new)
            yield Round(new, proposal.chosen if draft else None, len(draft), accepted, draft_seconds,
                        t2 - t1, proposal.failed, last, proposal.drafts, control, planned, pipelined, discarded)
            if last:
                return
    finally:
        if plan.length_stats is not None:
            plan.length_stats.forget(request_id)
        if slot is not None:
            slot.release()
        if early is not None:
            early.discard()
        # Let the SSMs finish early calls before their state is released, so nothing is left behind.
        await asyncio.gather(*early_tasks, return_exceptions=True)
        # Every engine, even an SSM whose breaker is open: one that was only slow still holds state.
        # Concurrently, so a dead stub's failing call (about 1 s) costs that once; this runs after
        # the request's final response has gone out.
        await asyncio.gather(*(client.release(m, request_id) for m in [plan.llm, *(drafter.ssms if drafter else ())]))
