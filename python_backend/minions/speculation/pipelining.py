"""Where each round's draft comes from, and drafting ahead while the LLM verifies.

Pipelining: while the LLM verifies round r, the drafter already drafts round r+1 on the assumption
that the whole draft is accepted, from the sequence plus the draft, one token longer: its first
token guesses the LLM's own token. If verification accepts everything and the guess is right, the
rest is round r+1's draft, ready (or nearly) when verification ends; otherwise it is discarded.

Both the regular and the early draft hold a DraftPool slot until they reach the LLM, so drafting
pauses while a full LLM batch of drafts is waiting. Round 1 is plain decoding (the LLM's prefill);
its early draft, from the prompt alone, overlaps the SSMs' prompt prefill with the LLM's. Later early
drafts are made up to `pipeline_max_load` concurrent requests, and beyond that only while the
selector expects them to be used (`pipeline_min_hit`): a likely-wasted early draft takes SSM time
that the other requests' drafts wait for, a likely-used one only moves work the SSMs would do anyway
off the critical path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from minions.decoding.engine_call import EngineClient
from minions.decoding.sampling import DRAFT_STREAM, SamplingParams, derived_seed
from minions.speculation.drafters import Drafter, DraftRound, Proposal
from minions.speculation.pool import DraftPool, Slot


@dataclass
class EarlyDraft:
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
        proposal.skip(emitted[-1:])
        return proposal


class DraftSource:
    """One request's drafts: the early draft when it holds, else a fresh one, each holding a pool
    slot until it reaches the LLM; early drafts for the next round while this one verifies."""

    def __init__(self, client: EngineClient, drafter: Drafter, pool: DraftPool | None, request_id: str,
                 sampling: SamplingParams, seed: int | None, confident: frozenset[str] = frozenset(),
                 whole: int = 0, instead: Callable[[list[float], int], int] | None = None) -> None:
        """`confident`: the SSMs to ask for their draft tokens' chances (DraftRound.confident); `whole`
        and `instead`: a vote's lookups asked ahead of its models (DraftRound's)."""
        self.client, self.drafter, self.pool = client, drafter, pool
        self.confident = confident
        self.whole, self.instead = whole, instead
        self.request_id, self.sampling = request_id, sampling
        self.seed = derived_seed(seed, DRAFT_STREAM)  # the SSMs' draws, independent of the LLM's
        self.early: EarlyDraft | None = None
        self.slot: Slot | None = None
        self._started: list[asyncio.Task] = []  # every early draft, awaited before the engines' release

    def round(self, sequence: list[int], k: int, index: int) -> DraftRound:
        """Round `index`'s request to the drafters: up to k tokens continuing `sequence`."""
        return DraftRound(self.request_id, list(sequence), k, sampling=self.sampling, seed=self.seed, index=index,
                          confident=self.confident, whole=self.whole, instead=self.instead)

    async def draft(self, sequence: list[int], k: int, index: int, last_emitted: list[int]) -> tuple[Proposal, bool]:
        """Round `index`'s proposal of up to k tokens (none for k = 0), and whether it was drafted early.
        A fresh draft holds a pool slot until `release_slot`."""
        if self.early is not None:
            taken = await self.early.take(last_emitted) if k > 0 else None
            self.drop_early()  # its pool slot: a taken draft reaches the LLM now, any other is dropped
            if taken is not None:
                return taken, True
        if k <= 0:
            return Proposal(), False
        self.slot = await self.pool.acquire() if self.pool is not None else None
        try:
            return await self.drafter.propose(self.client, self.round(sequence, k, index)), False
        except BaseException:
            self.release_slot()
            raise

    def drop_early(self) -> None:
        """Throw away the early draft held for this round, if any (plain decoding needs none), and free
        its pool slot; its call to the SSMs finishes in the background and is awaited at `close`."""
        if self.early is not None:
            self.early.discard()
            self.early = None

    def release_slot(self) -> None:
        """The round's draft no longer waits for the LLM (it has reached it, or it will not be sent):
        its pool slot is free for another request's draft."""
        if self.slot is not None:
            self.slot.release()
            self.slot = None

    def draft_ahead(self, sequence: list[int], draft: list[int], remaining: int, next_length: int, index: int) -> None:
        """Start drafting round index + 1 on the assumption that all of `draft` is accepted, if the
        pool has a free slot now. The early draft is one token longer than the next round will ask
        for (its first token guesses the LLM's own); `next_length` is the length policy's held
        choice, not this round's, or a pipeline whose early drafts keep passing would never take up
        a new choice. `remaining`: the tokens this round may still emit."""
        length = min(next_length, remaining - len(draft) - 2) + 1
        if length <= 1:
            return
        slot = self.pool.try_acquire() if self.pool is not None else None
        if self.pool is not None and slot is None:
            return
        task = asyncio.ensure_future(self.drafter.propose(self.client, self.round(sequence + draft, length, index + 1)))
        self.early = EarlyDraft(task, list(draft), slot)
        self._started = [t for t in self._started if not t.done()] + [task]

    def wasted(self, emitted: list[int]) -> bool:
        """Whether this round made an early draft that its outcome throws away."""
        return self.early is not None and not self.early.holds(emitted)

    async def close(self) -> None:
        """Give back every slot and let the SSMs finish early calls, so nothing is left behind."""
        self.release_slot()
        self.drop_early()
        await asyncio.gather(*self._started, return_exceptions=True)
