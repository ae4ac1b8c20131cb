"""The weighted-vote drafter: several SSMs draft concurrently and voting.py picks the draft."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from minions.decoding.engine_call import EngineClient
from minions.speculation.drafters import DraftRound, Proposal, ask_one
from minions.speculation.health import SsmHealth
from minions.speculation.voting import dominant, vote
from minions.speculation.watch import DraftRest
from minions.speculation.weights import SsmWeights, draft_score

log = logging.getLogger("minions.draft")


class VoteDrafter:
    """Majority-voted speculation over several SSMs called concurrently, with a deadline.

    When one SSM outweighs all the others together, the vote's result begins with its whole draft
    whatever the others say (voting.dominant), so only it is asked, except on every
    `explore_every`-th round, when one other SSM (in turn) drafts too, to keep the weights honest
    (an SSM that improves regains weight: none is starved). Even then the round waits
    only for the dominant SSM: the others join the vote if they are done by then, and are otherwise
    scored once verification is over (or dropped, if still drafting), so exploring never delays a
    round. A lone SSM may sample its draft (and send logits); a vote of several uses greedy drafts,
    judged by the deterministic rule.

    A vote of lookups (SSMs whose drafts carry their tokens' chances) and model SSMs asks the lookups
    first, whole (`DraftRound.whole`): a lookup draft that the decode loop prices cheaper per token
    than the models' k tokens (`DraftRound.instead`) is the round's draft, and the models are not
    asked (a copy costs them a forward pass a token, a lookup next to nothing). Otherwise the lookups'
    drafts join the vote of the models' as if asked with them. After a round whose lookups lost, they
    rest as a lookup request does on an LLM that does not stream (`rest`, watch.DraftRest).
    """

    def __init__(self, ssms: tuple[str, ...], health: SsmHealth, weights: SsmWeights, deadline_s: float,
                 explore_every: int, sampled: bool, rest: DraftRest | None = None,
                 ahead: Callable[[], bool] = lambda: True) -> None:
        """`rest`: when the lookups are asked ahead of the models (None: every round that can), and only
        while `ahead()` (the load allows it: each ask delays the round's model call)."""
        self.ssms = ssms
        self.health = health
        self.global_weights = weights
        self.weights = weights.child(ssms)
        self.deadline_s = deadline_s
        self.explore_every = max(1, explore_every)
        self.sampled = sampled
        self.rest = rest
        self.ahead = ahead
        self._seen = 0
        """The longest sequence drafted from so far: the rest counts the tokens since (`_lookups_first`)."""
        self._inflight: dict[str, asyncio.Future] = {}

    def _busy(self, ssm: str) -> bool:
        call = self._inflight.get(ssm)
        return call is not None and not call.done()

    def _available(self) -> list[str]:
        """The healthy SSMs with no call of this request still in flight (`ballot`)."""
        return [s for s in self.ssms if self.health.available(s) and not self._busy(s)]

    def ballot(self, index: int) -> tuple[list[str], str | None]:
        """The SSMs to ask this round (healthy ones whose previous draft for this request is done),
        and the dominant one among them, if any.

        A late or exploring SSM's call runs on after its round; asking it again before it is done
        would queue a second call behind the first, and under load such calls pile up in the
        SSM's queue faster than it drains them (seen: 11 s per draft). At most one call per SSM
        per request is ever in flight."""
        available = self._available()
        top = dominant(self.weights.snapshot(available))
        if top is None:
            return available, None
        if index % self.explore_every != 0:
            return [top], top
        # Exploring: one challenger at a time, in turn: every extra drafter takes cycles from the
        # dominant SSM and the LLM (docs/architecture.md, "The vote").
        challengers = [s for s in available if s != top]
        if not challengers:
            return [top], top
        return [top, challengers[(index // self.explore_every) % len(challengers)]], top

    async def propose(self, client: EngineClient, rnd: DraftRound) -> Proposal:
        first = await self._lookups_first(client, rnd)
        if first is not None and first.draft:
            return first
        asked, top = self.ballot(rnd.index)
        if first is not None:  # the lookups have answered: their drafts join the vote
            asked = [s for s in asked if s not in first.drafts and s not in first.failed]
            top = top if top in asked else None
        if len(asked) == 1:  # drafting alone, it may sample; the lookups' drafts are scored beside it
            alone = await ask_one(client, self.health, asked[0], rnd, sampled=self.sampled)
            if first is not None:
                alone.drafts, alone.failed = first.drafts | alone.drafts, first.failed + alone.failed
            return alone
        if not asked and first is None:
            return Proposal()
        tasks = {ssm: asyncio.ensure_future(ask_one(client, self.health, ssm, rnd, sampled=False)) for ssm in asked}
        self._inflight.update(tasks)
        if top is not None:
            # Exploring beside a dominant SSM: its draft is the round's, as in the rounds it drafts
            # alone, so it is waited for; the deadline is for the voters of a real vote. (Under load a
            # 16-token draft of the batched ssm_q4 takes longer than the deadline: it was dropped in
            # these rounds, which then decoded plainly.)
            await asyncio.wait([tasks[top]])
        elif tasks:
            await asyncio.wait(tasks.values(), timeout=self.deadline_s)
        ballots = first or Proposal()
        failed: list[str] = list(ballots.failed)
        late: list[str] = []
        drafts: dict[str, list[int]] = dict(ballots.drafts)
        log_probs: dict[str, list[float]] = dict(ballots.ballot_log_probs)
        exploring: dict[str, asyncio.Future] = {}
        for ssm, task in tasks.items():
            if task.done():
                result = task.result()
                failed += result.failed
                drafts.update(result.drafts)
                if result.log_probs is not None:
                    log_probs[ssm] = result.log_probs
            elif top is not None and ssm != top:
                exploring[ssm] = task
            else:  # the engine finishes its call on its own (it keeps its order before our release); the draft is dropped
                log.warning("%s: SSM %s missed the %.0f ms deadline", rnd.request_id, ssm, self.deadline_s * 1000)
                late.append(ssm)
        t0 = time.perf_counter()
        chosen = vote(drafts, self.weights.snapshot(list(drafts))) if drafts else None
        control = time.perf_counter() - t0
        proposal = Proposal(drafts=drafts, failed=tuple(failed + late), control_seconds=control,
                            exploring=exploring)
        if chosen is not None and chosen.draft:
            proposal.draft, proposal.chosen = chosen.draft, chosen.supporters[0]
            proposal.log_probs = log_probs.get(proposal.chosen)  # the voted path is its whole draft (voting.py)
        return proposal

    async def _lookups_first(self, client: EngineClient, rnd: DraftRound) -> Proposal | None:
        """The lookups' ballots, asked whole ahead of the model SSMs, with the round's draft in it if one
        of theirs is priced cheaper than the models' (`DraftRound.instead`); None where they are not
        asked first (no pricing, no lookup or no model SSM available, too many requests decoding, or
        resting)."""
        available = self._available()
        lookups = [s for s in available if s in rnd.confident]
        if rnd.instead is None or not lookups or len(lookups) == len(available) or not self.ahead():
            return None
        if self.rest is not None:
            self.rest.arrived(max(0, len(rnd.sequence) - self._seen))
            self._seen = max(self._seen, len(rnd.sequence))
            if not self.rest.asks(rnd.sequence):
                return None
        whole = replace(rnd, k=max(rnd.k, rnd.whole))
        tasks = {ssm: asyncio.ensure_future(ask_one(client, self.health, ssm, whole, sampled=False)) for ssm in lookups}
        self._inflight.update(tasks)
        done, _ = await asyncio.wait(tasks.values(), timeout=self.deadline_s)
        ballots = Proposal()
        for ssm, task in tasks.items():
            if task not in done:  # it finishes on its own; its draft is dropped, as a late voter's
                log.warning("%s: SSM %s missed the %.0f ms deadline", rnd.request_id, ssm, self.deadline_s * 1000)
                ballots.failed += (ssm,)
                continue
            result = task.result()
            ballots.failed += result.failed
            ballots.drafts.update(result.drafts)
            if result.log_probs is not None and result.draft:
                ballots.ballot_log_probs[ssm] = result.log_probs
        priced = {ssm: rnd.instead(chances, rnd.k) for ssm, chances in ballots.ballot_log_probs.items()}
        weights = self.weights.snapshot(lookups)
        best = max(priced, key=lambda s: (priced[s], weights[s]), default=None)
        won = best is not None and priced[best] > 0
        if self.rest is not None:
            self.rest.asked(found=won)
        if won:
            ballots.draft, ballots.chosen, ballots.ahead = list(ballots.drafts[best]), best, True
            ballots.log_probs = list(ballots.ballot_log_probs[best])
        return ballots

    def observe(self, proposal: Proposal, emitted: list[int], draft_seconds: float, verify_seconds: float) -> float:
        t0 = time.perf_counter()
        for ssm, task in proposal.exploring.items():
            if task.done():
                proposal.drafts.update(task.result().drafts)
            else:
                log.debug("SSM %s still exploring after verification: not scored this round", ssm)
        scores = {ssm: score for ssm, draft in proposal.drafts.items() if (score := draft_score(draft, emitted)) is not None}
        # A late SSM is not scored: under load it is queued, not wrong, and scoring it 0 would hand
        # its weight to fast, poor ones. The deadline already keeps it from delaying rounds.
        self.weights.update(scores)
        self.global_weights.update(scores)
        return time.perf_counter() - t0
