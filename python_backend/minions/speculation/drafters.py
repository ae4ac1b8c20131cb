"""Drafters: how one round's draft is obtained from the SSMs. This module holds what every drafter
shares (the round, the proposal, the protocols) and the single-SSM drafter; the vote and the bandit
live in vote_drafter.py and bandit.py.

A drafter never raises because of an SSM: a failed or late SSM is reported in the proposal and the
round goes on with what arrived (possibly no draft at all, i.e. plain decoding). Drafters also learn
from each verification (`observe`): the vote's weights, the bandit's rewards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from minions.decoding.engine_call import EngineClient, EngineRequest
from minions.decoding.sampling import GREEDY, SamplingParams
from minions.speculation.health import SsmHealth

log = logging.getLogger("minions.draft")


@dataclass
class DraftRound:
    """What every SSM asked in a round gets: the sequence so far and how to draft."""

    request_id: str
    sequence: list[int]
    k: int
    sampling: SamplingParams = GREEDY
    """The request's sampling when the SSM should sample its draft (and send logits); GREEDY otherwise."""
    seed: int | None = None
    index: int = 0
    """Round number within the request (for exploration schedules)."""
    confident: frozenset[str] = frozenset()
    """SSMs asked for their draft tokens' estimated chances (log probs): the lookup engines'."""
    whole: int = 0
    """Tokens a vote asks its confident SSMs for when they draft ahead of its model SSMs (0: k)."""
    instead: Callable[[list[float], int], int] | None = None
    """How many tokens of a confident SSM's draft (its tokens' log chances) to verify in place of the
    model SSMs' k, 0: ask them (the decode loop's pricing; None: a vote asks all its SSMs together)."""

    def engine_request(self, ssm: str, sampled: bool) -> EngineRequest:
        return EngineRequest(
            self.request_id, list(self.sequence), self.k,
            sampling=self.sampling if sampled else GREEDY, seed=self.seed if sampled else None,
            return_generation_logits=sampled, return_log_probs=ssm in self.confident,
            exclude_input_in_output=True,
        )


@dataclass
class Proposal:
    draft: list[int] = field(default_factory=list)
    logits: np.ndarray | None = None
    """[len(draft), vocab] when the draft was sampled from these logits (min(1, p/q) rule)."""
    chosen: str | None = None
    drafts: dict[str, list[int]] = field(default_factory=dict)
    """Every SSM's draft that arrived in time (the vote's ballots; one entry for a single SSM)."""
    failed: tuple[str, ...] = ()
    """SSMs that failed or missed the deadline this round (a late one is slow, not broken: no breaker, no score)."""
    control_seconds: float = 0.0
    """Time spent choosing (vote, bandit), not waiting for engines."""
    exploring: dict[str, asyncio.Future] = field(default_factory=dict)
    """Drafts still being made by SSMs the round did not wait for (scored if done by verification's end)."""
    log_probs: list[float] | None = None
    """The draft's tokens' estimated log chance of being right, each given the ones before it were, when
    the SSM that drafted it gives one (DraftRound.confident); None otherwise."""
    priced_out: int = 0
    """Tokens cut off the draft's end as not worth verifying at the load (RequestPricing.cut)."""
    ballot_log_probs: dict[str, list[float]] = field(default_factory=dict)
    """Each confident SSM's tokens' log chances, by SSM, where a vote asked its lookups first."""
    ahead: bool = False
    """The draft is a lookup's, asked ahead of the vote's model SSMs, which were not asked: the length
    statistics take the round as that lookup's own (its drafting cost, its acceptance)."""

    def skip(self, made: list[int]) -> None:
        """Drop the draft's first len(made) tokens, which the LLM has since made (as they were drafted:
        the caller checks), from the draft and what goes with it; every SSM's draft that did not begin
        with them is dropped."""
        n = len(made)
        self.draft = self.draft[n:]
        if self.logits is not None:
            self.logits = self.logits[n:]
        if self.log_probs is not None:
            self.log_probs = self.log_probs[n:]
        self.drafts = {ssm: d[n:] for ssm, d in self.drafts.items() if len(d) > n and d[:n] == made}

    def cut(self, k: int) -> None:
        """Keep the draft's first k tokens."""
        self.draft = self.draft[:k]
        if self.logits is not None:
            self.logits = self.logits[:k]
        if self.log_probs is not None:
            self.log_probs = self.log_probs[:k]


class Drafter(Protocol):
    ssms: tuple[str, ...]

    async def propose(self, client: EngineClient, rnd: DraftRound) -> Proposal: ...

    def observe(self, proposal: Proposal, emitted: list[int], draft_seconds: float, verify_seconds: float) -> float:
        """Learn from a verification; returns the control time it took."""
        ...


async def ask_one(client: EngineClient, health: SsmHealth, ssm: str, rnd: DraftRound, sampled: bool) -> Proposal:
    """One SSM's draft, or an empty proposal naming it as failed."""
    try:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that lands as the
        # call completes (CPython gh-86296), and the cancelled request would decode on.
        async with asyncio.timeout(health.call_timeout_s):
            result = await client.generate(ssm, rnd.engine_request(ssm, sampled))
    except TimeoutError:
        _record_failure(health, ssm, rnd.request_id, f"no draft in {health.call_timeout_s:.0f} s")
        return Proposal(failed=(ssm,))
    except Exception as exc:  # a request never fails because of an SSM
        _record_failure(health, ssm, rnd.request_id, exc)
        return Proposal(failed=(ssm,))
    health.succeeded(ssm)
    draft = result.tokens[: rnd.k]
    logits = result.logits[: len(draft)] if draft and sampled and result.logits is not None else None
    log_probs = result.log_probs[: len(draft)] if result.log_probs is not None else None
    return Proposal(draft, logits, ssm if draft else None, {ssm: draft}, log_probs=log_probs)


def _record_failure(health: SsmHealth, ssm: str, request_id: str, exc: BaseException | str) -> None:
    log.warning("%s: SSM %s failed: %s", request_id, ssm, exc)
    if health.failed(ssm, str(exc)):
        log.warning("SSM %s skipped by all requests for %.0f s", ssm, health.cooldown_s)


class SingleDrafter:
    def __init__(self, ssm: str, health: SsmHealth, sampled: bool) -> None:
        self.ssms = (ssm,)
        self.health = health
        self.sampled = sampled

    async def propose(self, client: EngineClient, rnd: DraftRound) -> Proposal:
        if not self.health.available(self.ssms[0]):
            return Proposal()
        return await ask_one(client, self.health, self.ssms[0], rnd, sampled=self.sampled)

    def observe(self, proposal: Proposal, emitted: list[int], draft_seconds: float, verify_seconds: float) -> float:
        return 0.0
