"""The orchestrator's decode loop, free of Triton so it is tested against in-process engines.

Each round: draft → verify → accept → observe → emit. A drafter (one SSM, a weighted vote of several,
or a bandit's pick) proposes k tokens from the whole sequence; the LLM verifies them and returns the
accepted prefix plus one token of its own (TensorRT-LLM's draft-tokens-external mode); the drafter
and the draft-length policy learn from the outcome; the round is yielded. With speculation `off`
the LLM is called with no draft and returns one token: plain decoding through the same engine and
path. The whole sequence is resent every round (engines keep their own prefix KV caches), and every
engine's state for the request is released when it ends, however it ends.

When the LLM streams (an in-flight llama.cpp engine), plain decoding is one streaming call instead of
a call per token: `off` streams the whole output, and a stretch the selector gives s = 0 streams
`plain_stretch` tokens before it chooses again. Each streamed token is a round of its own.

The draft length is fixed, or chosen each round by the adaptive selector (draft_length.py), which
may choose 0 (plain decoding) when speculation does not pay. Drafting ahead during verification and
the draft pool are pipelining.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from minions.engines.api import EngineRequest
from minions.engines.sequence_cache import common_prefix_len
from minions.speculation.draft_length import DraftLengthSelector, FixedLength
from minions.speculation.drafters import EngineClient, Proposal
from minions.speculation.pipelining import DraftSource
from minions.speculation.plan import DecodeRequest, Services
from minions.speculation.rounds import Round
from minions.speculation.sampling import round_seed


async def speculative_decode(client: EngineClient, request: DecodeRequest, services: Services,
                             request_id: str) -> AsyncIterator[Round]:
    """Yield one Round per LLM verification or streamed plain token until max_new_tokens or end_id;
    release caches at the end.

    Close the generator (e.g. with contextlib.aclosing) to stop early: the finally clause frees the
    engines' state for this request (after any early draft still running has finished).
    """
    progress = _Progress(list(request.prompt_ids), request.max_new_tokens, request.end_id)
    seed = request.seed if request.seed is not None else int(np.random.default_rng().integers(2**62))
    drafter = services.drafter(request)
    length = services.draft_length(request, drafting=drafter is not None)
    source = DraftSource(client, drafter, services.pool, request_id, request.sampling, seed) if drafter else None
    drafted_before = False  # the first draft also pays the SSMs' prefill of the prompt
    stream_next = drafter is None  # `off` streams from the start
    try:
        while not progress.finished:
            remaining, batch = progress.remaining, services.load()
            # Round 1 is plain decoding: the first token costs one LLM prefill, as in `off` (TTFT).
            planned = length.choose(batch) if drafter and progress.produced > 0 else 0
            k = min(planned, remaining - 1)
            probe = k == 0 and progress.produced > 0 and not stream_next and services.probe_pays(length, batch)
            if probe:  # the selector chose plain decoding, but free drafters may hold a long match
                k = min(services.probe_tokens, remaining - 1)
            if services.llm_streams and (stream_next or (k == 0 and progress.produced > 0)):
                if source is not None:  # drops an early draft still held
                    await source.draft(progress.sequence, 0, progress.index, progress.emitted)
                stretch = remaining if drafter is None else min(remaining, services.plain_stretch)
                services.length_stats.report(request_id, 0)
                plains = _stream_plain(client, services, length, batch, request, request_id, progress.sequence, stretch,
                                       seed)
                async with aclosing(plains):
                    async for plain in plains:
                        plain.last = progress.advance(plain.tokens)
                        yield plain
                        if plain.last:
                            return
                stream_next = drafter is None
                continue
            t0 = time.perf_counter()
            # Draft.
            proposal, pipelined = (await source.draft(progress.sequence, k, progress.index, progress.emitted) if source
                                   else (Proposal(), False))
            draft = proposal.draft = proposal.draft[:k]
            if proposal.logits is not None:
                proposal.logits = proposal.logits[: len(draft)]
            t1 = time.perf_counter()
            too_short = len(draft) < (services.probe_min_draft if probe else 1)
            if services.llm_streams and progress.produced > 0 and too_short:
                # The drafters found nothing (or a probe found too little to pay for a verification): a
                # one-token call would cost a round trip to the LLM model; stream instead.
                if source is not None:
                    source.sent()
                stream_next = True
                continue
            # Verify; meanwhile draft the next round early. Round 1's LLM work is the prompt's prefill.
            services.length_stats.report(request_id, len(draft) if progress.produced else len(progress.sequence) - 1)
            verification = asyncio.ensure_future(
                client.generate(services.llm, _verify_call(request, request_id, progress.sequence, proposal, seed)))
            if source is not None:
                source.sent()
                # Round 1 (plain decoding) drafts round 2 from the prompt at any load: that moves the
                # SSMs' prompt prefill, which every request pays, off the critical path.
                if request.pipeline and (progress.produced == 0
                                         or draft and services.early_draft_pays(length, batch, len(draft))):
                    source.draft_ahead(progress.sequence, draft, remaining, length.current, progress.index)
            # Accept.
            verdict = await verification
            emitted = verdict.tokens[:remaining]
            t2 = time.perf_counter()
            if not emitted:
                raise RuntimeError(f"engine {services.llm!r} returned no token")
            last = progress.advance(emitted)
            # Observe. TensorRT-LLM returns tokens only: the accepted count is the prefix shared with the draft.
            accepted = common_prefix_len(emitted, draft)
            draft_seconds = t1 - t0 - proposal.control_seconds
            control = proposal.control_seconds + (drafter.observe(proposal, emitted, draft_seconds, t2 - t1) if k > 0 else 0.0)
            if progress.index > 1:  # round 1 is the prompt's prefill, not a verification
                length.observe(batch, len(draft), accepted, draft_seconds if drafted_before else None, t2 - t1)
            drafted_before = drafted_before or bool(draft)
            # Emit.
            yield Round(tokens=emitted, ssm=proposal.chosen if draft else None, drafted=len(draft), accepted=accepted,
                        draft_seconds=draft_seconds, verify_seconds=t2 - t1, failed=proposal.failed, last=last,
                        drafts=proposal.drafts, control_seconds=control, planned=planned, pipelined=pipelined,
                        early_discarded=source is not None and source.wasted(emitted),
                        log_probs=_first(verdict.log_probs, remaining))
            if last:
                return
    finally:
        services.length_stats.forget(request_id)
        # Shielded: a request cancelled while it cleans up still frees every engine's state.
        await asyncio.shield(_release(client, services.llm, drafter.ssms if drafter else (), source, request_id))


async def _release(client: EngineClient, llm: str, ssms: tuple[str, ...], source: DraftSource | None,
                   request_id: str) -> None:
    """Free a finished request's state in every engine, once its early drafts are done. Every SSM,
    even one whose breaker is open (one that was only slow still holds state), and concurrently, so
    a dead stub's failing call costs that once; this runs after the request's final response."""
    if source is not None:
        await source.close()
    await asyncio.gather(*(client.release(m, request_id) for m in [llm, *ssms]))


@dataclass
class _Progress:
    """What a request has produced so far, advanced by every round, verified or streamed."""

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


async def _stream_plain(client: EngineClient, services: Services, length: DraftLengthSelector | FixedLength,
                        batch: int, request: DecodeRequest, request_id: str, sequence: list[int], n: int,
                        seed: int) -> AsyncIterator[Round]:
    """Up to n plain tokens streamed from one LLM call, a round each (timed from the one before)."""
    call = EngineRequest(request_id, list(sequence), n, sampling=request.sampling,
                         seed=round_seed(seed, len(sequence)), end_id=request.end_id, bad_words=request.bad_words,
                         penalties=request.penalties, return_log_probs=request.return_log_probs,
                         exclude_input_in_output=True, streaming=True)
    t = time.perf_counter()
    async with aclosing(client.stream(services.llm, call)) as stream:
        async for result in stream:
            now = time.perf_counter()
            length.observe(batch, 0, 0, None, now - t)
            yield Round(tokens=result.tokens[:n], ssm=None, drafted=0, accepted=0, draft_seconds=0.0,
                        verify_seconds=now - t, log_probs=_first(result.log_probs, n))
            t = now


def _verify_call(request: DecodeRequest, request_id: str, sequence: list[int], proposal: Proposal,
                 seed: int) -> EngineRequest:
    """The LLM call that verifies the proposal's draft (none: one plain token)."""
    return EngineRequest(
        request_id, list(sequence), len(proposal.draft) + 1, draft=proposal.draft,
        draft_logits=proposal.logits if proposal.draft else None, sampling=request.sampling,
        seed=round_seed(seed, len(sequence)), end_id=request.end_id, bad_words=request.bad_words,
        penalties=request.penalties, return_log_probs=request.return_log_probs, exclude_input_in_output=True,
    )


def _first(log_probs: list[float] | None, n: int) -> list[float] | None:
    return None if log_probs is None else log_probs[:n]
