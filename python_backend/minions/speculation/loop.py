"""The orchestrator's decode loop, free of Triton so it is tested against in-process engines.

Each turn plans a round (round_plan.py), runs it, and yields what it emitted:
- `Verify`: a drafter (one SSM, a weighted vote of several, or a bandit's pick) proposes up to k
  tokens; the LLM verifies them and returns the accepted prefix plus one token of its own
  (TensorRT-LLM's draft-tokens-external mode). With no draft it returns one plain token.
- `StreamPlain`: one streaming call to an LLM that streams, each token a round of its own, while
  the drafters are probed (watch.py): a probe's draft worth verifying ends the stream.
Both paths observe through one method, so the drafter and the length policy learn from each outcome.
The whole sequence is resent every call (engines keep their own prefix caches), and every engine's
state for the request is released when it ends, however it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from minions.decoding.engine_call import EngineClient, EngineRequest, EngineResult
from minions.decoding.tokens import common_prefix_len
from minions.speculation.decode_request import DecodeRequest
from minions.speculation.drafters import Proposal
from minions.speculation.pipelining import DraftSource
from minions.speculation.pricing.draft_length import length_policy
from minions.speculation.pricing.gates import early_draft_pays, probe_pays
from minions.speculation.pricing.request_pricing import RequestPricing
from minions.speculation.round_plan import StreamPlain, Verify, plan_round
from minions.speculation.rounds import Round
from minions.speculation.services import Services
from minions.speculation.watch import DraftWatch


async def speculative_decode(client: EngineClient, request: DecodeRequest, services: Services,
                             request_id: str, on_llm_release: Callable[[], None] = lambda: None
                             ) -> AsyncIterator[Round]:
    """Yield one Round per LLM verification or streamed plain token until max_new_tokens or end_id;
    release caches at the end.

    Close the generator (e.g. with contextlib.aclosing) to stop early: the finally clause frees the
    engines' state for this request (after any early draft still running has finished).
    `on_llm_release` is called once the LLM's release of the request's sequence is queued: a call
    sent to the LLM after that reaches the engine behind it (_Decode.release).
    """
    decode = _Decode(client, request, services, request_id)
    try:
        while not decode.progress.finished:
            plan = decode.plan()
            rounds = decode.stream_plain(plan) if isinstance(plan, StreamPlain) else decode.verify(plan)
            async with aclosing(rounds):
                async for r in rounds:
                    yield r
                    if r.last:
                        return
    finally:
        services.length_stats.forget(request_id)
        # Shielded: a request cancelled while it cleans up still frees every engine's state.
        await asyncio.shield(decode.release(on_llm_release))


@dataclass
class Progress:
    """A request's sequence, its tokens so far against its budget, and whether it has ended."""

    sequence: list[int]
    """The prompt and every token emitted: what the LLM continues."""
    max_new_tokens: int
    end_id: int | None
    produced: int = 0
    index: int = 0
    """Rounds so far."""
    emitted: list[int] = field(default_factory=list)
    """The last round's tokens."""
    ended: bool = False
    """end_id was emitted."""

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.produced

    @property
    def finished(self) -> bool:
        return self.ended or self.produced >= self.max_new_tokens

    def advance(self, tokens: list[int]) -> bool:
        """Add one round's tokens; True once max_new_tokens or end_id is reached (no round follows)."""
        self.emitted = tokens
        self.sequence += tokens
        self.produced += len(tokens)
        self.index += 1
        self.ended = self.end_id is not None and self.end_id in tokens
        return self.finished


class _Decode:
    """One request's decoding: its progress, drafter, length policy and drafts, and how each plan runs."""

    def __init__(self, client: EngineClient, request: DecodeRequest, services: Services, request_id: str) -> None:
        self.client, self.request, self.services, self.request_id = client, request, services, request_id
        self.progress = Progress(list(request.prompt_ids), request.max_new_tokens, request.end_id)
        self.drafter = services.drafter(request)
        self.length = length_policy(services.length_stats, drafting=self.drafter is not None,
                                    num_draft_tokens=request.num_draft_tokens,
                                    max_draft_tokens=request.max_draft_tokens, pipelined=request.pipeline,
                                    drafters=request.speculation.ssms, request_id=request_id)
        # Drafts are cut by their chances only when the length is adaptive: a request that fixed its
        # num_draft_tokens has its drafts verified as asked, so its SSMs are not asked for chances.
        confident = services.confident_ssms if request.num_draft_tokens is None else frozenset()
        asked_whole = bool(confident) and self.drafter is not None and set(self.drafter.ssms) <= confident
        self.pricing = RequestPricing(services.length_stats, self.length, max_draft_tokens=request.max_draft_tokens,
                                      asked_whole=asked_whole, load=services.load)
        """What the request's drafts are worth: how many tokens to ask, how many to verify."""
        self.source = (DraftSource(client, self.drafter, services.pool, request_id, sampling=request.sampling,
                                   seed=request.seed, confident=confident, whole=request.max_draft_tokens,
                                   instead=self.pricing.instead if confident else None)
                       if self.drafter else None)
        self.drafted_before = False
        """The first draft also pays the SSMs' prefill of the prompt: its drafting time is not a sample."""
        self.drafts_came_back_empty = False
        stop = (lambda: client.interrupt(services.llm, request_id)) if services.llm_stops_streams else None
        schedule, repeats = services.probe_schedule(from_start=True)
        self.watch = (DraftWatch(schedule, services.settings.probe.min_draft, self._probe, stop, repeats=repeats,
                                 on_end=services.on_probe)
                      if self.drafter and services.llm_streams and services.settings.probe.tokens > 0 else None)
        self.rest = services.draft_rest() if self.pricing.asked_whole and not services.llm_streams else None
        """On an LLM that does not stream, a lookup request's rounds ask its drafters only as DraftRest says."""
        self.found: Proposal | None = None
        """A draft a probe found during the last plain stream, for the next round to verify."""

    def plan(self) -> StreamPlain | Verify:
        asks = self.drafter is not None and (self.rest is None or self.rest.asks(self.progress.sequence))
        plan = plan_round(self.services, self.length, drafting=asks,
                          first=self.progress.produced == 0, remaining=self.progress.remaining,
                          drafts_came_back_empty=self.drafts_came_back_empty,
                          found=len(self.found.draft) if self.found else 0,
                          lookups_only=self.pricing.asked_whole and self.watch is not None)
        self.drafts_came_back_empty = False
        return plan

    async def _probe(self, sequence: list[int]) -> Proposal:
        """The drafters' proposal continuing `sequence`, asked while plain tokens stream."""
        k = self.pricing.asked(max(self.services.settings.probe.tokens, self.length.current))
        proposal = await self.drafter.propose(self.client, self.source.round(sequence, k, self.progress.index))
        self.pricing.cut(proposal, self.services.load(), len(sequence), stops_stream=True)
        return proposal

    async def stream_plain(self, plan: StreamPlain) -> AsyncIterator[Round]:
        """Up to plan.tokens plain tokens streamed from one LLM call, a round per response (timed from the
        one before; an engine may send several steps' tokens at once, each a plain step to the policy)."""
        if self.source is not None:
            self.source.drop_early()
        self._report_work(0)
        interval = self.services.stream_interval_s(self.request.stream_interval_s, plan.batch)
        call = self.request.llm_call(self.request_id, self.progress.sequence, plan.tokens, streaming=True,
                                     stream_interval_s=interval)
        watch = self.watch if plan.watch else None
        restarted = self.progress.produced > 0  # its first token costs a call, not a step (restart_extra)
        t = time.perf_counter()
        new_call = True
        async with aclosing(self.client.stream(self.services.llm, call)) as stream:
            async for result in stream:
                if not result.tokens:  # the final answer of a stream a probe stopped may hold nothing new
                    continue
                now = time.perf_counter()
                tokens = result.tokens[: plan.tokens]
                last = self._observe(tokens, plan.batch, drafted=0, accepted=0, draft_seconds=None, llm_seconds=now - t,
                                      steps=len(tokens))
                yield Round(tokens=tokens, ssm=None, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=now - t,
                            last=last, llm_call=new_call, log_probs=_first(result.log_probs, plan.tokens),
                            cached_tokens=_cached(call, result) if new_call else 0)
                if new_call:
                    self._report_work(0)  # a stream from the prompt is past its prefill: plain steps follow
                    if restarted and len(tokens) == 1:
                        self.services.length_stats.verify.observe_restart(plan.batch, now - t)
                t, new_call = now, False
                if watch is not None:
                    watch.arrived(self.progress.sequence, len(tokens),
                                  probe_pays(self.services.settings, self.services.length_stats, self.length,
                                             self.services.load()))
        if watch is not None:
            self.found = await watch.settle(self.progress.sequence)

    async def verify(self, plan: Verify) -> AsyncIterator[Round]:
        """Draft up to plan.k tokens and verify them in one LLM call (drafting the next round meanwhile);
        nothing, when a streaming LLM would be asked to verify no draft at all (the next plan streams)."""
        t0 = time.perf_counter()
        proposal, pipelined = await self._draft(plan)
        t1 = time.perf_counter()
        if self.services.llm_streams and self.progress.produced > 0 and not proposal.draft:
            # The drafters found nothing: a one-token call would cost a round trip to the LLM model;
            # stream instead.
            if self.source is not None:
                self.source.release_slot()
            self.drafts_came_back_empty = True
            return
        call, verification = self._send(plan, proposal)
        verdict = await verification
        t2 = time.perf_counter()
        remaining = self.progress.remaining
        emitted = verdict.tokens[:remaining]
        if not emitted:
            raise RuntimeError(f"engine {self.services.llm!r} returned no token")
        # TensorRT-LLM returns tokens only: the accepted count is the prefix shared with the draft.
        accepted = common_prefix_len(emitted, proposal.draft)
        yield self._verified(plan, proposal, emitted, accepted, draft_seconds=t1 - t0 - proposal.control_seconds,
                             llm_seconds=t2 - t1, pipelined=pipelined, log_probs=_first(verdict.log_probs, remaining),
                             cached_tokens=_cached(call, verdict))

    async def _draft(self, plan: Verify) -> tuple[Proposal, bool]:
        """The round's draft, cut to what is worth verifying: the one a probe found, or the drafters'
        (and whether it was drafted early, during the last verification)."""
        progress = self.progress
        asked = self.pricing.asked(plan.k)
        if self.found is not None:
            (proposal, pipelined), self.found = (self.found, False), None
        else:
            proposal, pipelined = (await self.source.draft(progress.sequence, asked, progress.index, progress.emitted)
                                   if self.source else (Proposal(), False))
        self.pricing.cut(proposal, plan.batch, len(progress.sequence), asked=asked, room=progress.remaining - 1)
        if self.rest is not None and plan.k > 0:
            self.rest.asked(found=bool(proposal.draft))
        return proposal, pipelined

    def _send(self, plan: Verify, proposal: Proposal) -> tuple[EngineRequest, asyncio.Future]:
        """Send the draft to the LLM to verify, and draft the next round meanwhile where that pays."""
        progress, draft = self.progress, proposal.draft
        self._report_work(len(draft))
        call = self.request.llm_call(self.request_id, progress.sequence, len(draft) + 1, draft=draft,
                                     draft_logits=proposal.logits if draft else None)
        verification = asyncio.ensure_future(self.client.generate(self.services.llm, call))
        if self.source is not None:
            self.source.release_slot()
            # Round 1 (plain decoding) drafts round 2 from the prompt at any load: that moves the
            # SSMs' prompt prefill, which every request pays, off the critical path.
            if self.request.pipeline and (progress.produced == 0 or draft and early_draft_pays(
                    self.services.settings, self.length, plan.batch, len(draft))):
                self.source.draft_ahead(progress.sequence, draft, remaining=progress.remaining,
                                        next_length=self.pricing.asked(self.length.current), index=progress.index)
        return call, verification

    def _verified(self, plan: Verify, proposal: Proposal, emitted: list[int], accepted: int, *, draft_seconds: float,
                  llm_seconds: float, pipelined: bool, log_probs: list[float] | None, cached_tokens: int) -> Round:
        """Advance by a verification's tokens, let every estimate learn from it, and say it as a Round
        (`pipelined`, `log_probs`, `cached_tokens`: the draft's and the LLM's answer's, as Round says)."""
        draft = proposal.draft
        if proposal.log_probs is not None and draft:
            self.pricing.calibration.observe(proposal.log_probs, accepted)
        control = proposal.control_seconds + (
            self.drafter.observe(proposal, emitted, draft_seconds, llm_seconds) if self.drafter and plan.k > 0 else 0.0)
        early_discarded = self.source is not None and self.source.wasted(emitted)
        # A round that waited for an SSM which failed or missed the vote's deadline measured the wait,
        # not drafting: as a sample it priced drafting out (docs/adaptive-draft-length.md).
        measured = None if proposal.failed else draft_seconds
        last = self._observe(emitted, plan.batch, drafted=len(draft), accepted=accepted, draft_seconds=measured,
                             llm_seconds=llm_seconds,
                             drafters=(proposal.chosen,) if proposal.ahead and draft else None)
        if self.watch is not None:
            self.watch.schedule.verified(len(draft), accepted)
        if self.rest is not None:
            self.rest.arrived(len(emitted))
            self.rest.verified(len(draft), accepted)
        return Round(tokens=emitted, ssm=proposal.chosen if draft else None, drafted=len(draft), accepted=accepted,
                     draft_seconds=draft_seconds, verify_seconds=llm_seconds, failed=proposal.failed, last=last,
                     drafts=proposal.drafts, control_seconds=control, planned=plan.planned, pipelined=pipelined,
                     early_discarded=early_discarded, log_probs=log_probs, cached_tokens=cached_tokens)

    def _report_work(self, drafted: int) -> None:
        """Tell the length statistics what this request puts through the LLM now, in draft tokens (the
        tokens beyond one): the draft, or for round 1 the prompt's prefill."""
        first = self.progress.produced == 0
        self.services.length_stats.report(self.request_id, len(self.progress.sequence) - 1 if first else drafted)

    def _observe(self, tokens: list[int], batch: int, drafted: int, accepted: int, draft_seconds: float | None,
                 llm_seconds: float, steps: int = 1, drafters: tuple[str, ...] | None = None) -> bool:
        """Advance by a round's tokens and let the length policy learn from it, verified or streamed
        (round 1 is the prompt's prefill, not a step of decoding; `steps` plain steps share
        `llm_seconds`; `drafters`: the SSMs whose round it was, where not all of the request's); True
        once no round follows."""
        last = self.progress.advance(tokens)
        self.pricing.calibration.settle(self.progress.sequence)
        if self.progress.index > 1:
            steps = max(steps, 1)
            for _ in range(steps):
                self.length.observe(batch, drafted, accepted,
                                    draft_seconds=draft_seconds if self.drafted_before else None,
                                    verify_seconds=llm_seconds / steps, drafters=drafters)
        self.services.length_stats.answered(self.request_id)
        self.drafted_before = self.drafted_before or drafted > 0
        return last

    async def release(self, on_llm_release: Callable[[], None]) -> None:
        """Free a finished request's state in every engine; this runs after the request's final response.
        The LLM's first, at once: only SSMs draft early, and a probe's interrupt that reaches the LLM
        after the release ends nothing. Once its `stop` is queued on the LLM's stream (the release's
        first step), `on_llm_release` is told, so that the orchestrator can start the next request
        there: its calls reach the engine behind the stop, which frees the slot at the same step
        boundary, instead of the next request waiting a whole step for the stop's answer. Every SSM
        once its early drafts are done, even one whose breaker is open (one that was only slow still
        holds state), and concurrently, so a dead stub's failing call costs that once."""
        llm = asyncio.ensure_future(self.client.release(self.services.llm, self.request_id))
        await asyncio.sleep(0)  # the release's first step: its message queued
        on_llm_release()
        if self.watch is not None:
            await self.watch.close()
        if self.source is not None:
            await self.source.close()
        ssms = self.drafter.ssms if self.drafter else ()
        await asyncio.gather(llm, *(self.client.release(m, self.request_id) for m in ssms))


def _cached(call: EngineRequest, result: EngineResult) -> int:
    """The call's input tokens the LLM found cached, where the call asked (the request's first)."""
    return result.cached_tokens if call.return_perf_metrics else 0


def _first(log_probs: list[float] | None, n: int) -> list[float] | None:
    return None if log_probs is None else log_probs[:n]
