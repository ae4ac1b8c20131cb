"""Watching a plain stream for a draft worth verifying, so that plain decoding costs what `off` costs.

While a streaming LLM decodes plain tokens for a request that drafts, the drafters are asked now and
then (a probe) for a draft that continues what has arrived. A probe that finds one at least
`min_draft` tokens long stops the stream (tensorrt_llm's `stop`: the engine ends the call before its
next step and answers the tokens it had made); the draft, less the tokens the stream made meanwhile,
is verified next. A probe that finds nothing ends nothing: plain decoding goes on in the same call,
with no gap in the LLM's work between calls (docs/benchmarks.md measures what ending the stream to
ask would cost).

Probes back off: the first comes `first_gap` tokens in, and the tokens between two probes double
after each probe that found nothing and each verification that accepted less than half its draft,
up to `max_gap`, and fall back to `min_gap` after a verification that accepted at least half. Text
that gives the drafters nothing costs a few probes, text that copies is probed often. A probe that
finds a draft stops the stream for a verification that may fail, and chat's first probes mostly find
nothing worth one, hence the later first one (docs/benchmarks.md).

The back-off does not wait where the text shows a lookup can draft: once the sequence's last few
tokens occurred earlier in it (`TailRepeats`, a set of the request's n-grams kept in the
orchestrator), a probe comes `min_gap` tokens after the last one. A code edit that goes back to
copying after a new line of its own is probed at once, not up to `max_gap` tokens later. Before a
request's first probe there is no last one: a repeating tail is probed from the answer's first token
on. A conversation's prompt ends with the chat template's assistant header, as each earlier answer
began, so an answer that starts as one of them did (a file edited again) is drafted from its second
token, not from its ninth.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from minions.speculation.drafters import Proposal

PROBE_OUTCOMES = ("found", "empty", "priced_out", "cancelled")
"""How a probe ends: a draft worth verifying (the stream is stopped for it), nothing at least
`min_draft` tokens long, a draft that long cut shorter as not worth verifying at the load (the
verification costs against its chances: a server whose probes all end so has stopped drafting on
costs, not on its drafters), or cancelled unanswered (its stream ended on its own, or the request did)."""


@dataclass
class ProbeSchedule:
    """When the next probe is due: tokens since the last one against a gap that backs off."""

    min_gap: int
    max_gap: int
    first_gap: int | None = None
    """Tokens before the first probe (None: min_gap)."""
    gap: int = field(init=False)
    since: int = 0
    """Tokens arrived since the last probe (or since the request's stream began)."""
    probes: int = 0
    """Probes started for the request."""

    def __post_init__(self) -> None:
        self.gap = self.min_gap if self.first_gap is None else min(self.first_gap, self.max_gap)

    @property
    def due(self) -> bool:
        return self.since >= self.gap

    def arrived(self, tokens: int) -> None:
        self.since += tokens

    @property
    def repeat_gap(self) -> int:
        """Tokens after the last probe before a repeating tail brings the next: `min_gap`, and 1 before
        the first probe (no last one)."""
        return self.min_gap if self.probes else 1

    def probed(self) -> None:
        self.since = 0
        self.probes += 1

    def found_nothing(self) -> None:
        self.gap = min(self.gap * 2, self.max_gap)

    def verified(self, drafted: int, accepted: int) -> None:
        """A verification's outcome: half its draft accepted or more brings probes back to `min_gap`."""
        if drafted > 0 and 2 * accepted >= drafted:
            self.gap = self.min_gap
        elif drafted > 0:
            self.found_nothing()


class TailRepeats:
    """Whether a sequence's last `n` tokens occurred earlier in it: where prompt lookup finds a match
    (the rule of `ngram_draft(sequence, 1, n, n)`, checked against it in test_draft_watch). The n-grams
    seen are indexed as the sequence grows (each once), so a check costs the new tokens, not a scan."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: set[tuple[int, ...]] = set()
        self.indexed = 0
        """The n-grams starting before this position are in `seen`."""

    def at_end(self, sequence: list[int]) -> bool:
        tail = len(sequence) - self.n
        if tail < 1:
            return False
        for i in range(self.indexed, tail):
            self.seen.add(tuple(sequence[i:i + self.n]))
        self.indexed = max(self.indexed, tail)
        return tuple(sequence[tail:]) in self.seen


def probe_due(schedule: ProbeSchedule, repeats: TailRepeats | None, sequence: list[int]) -> bool:
    """By the schedule, or where the tail repeats `min_gap` tokens after the last probe (from the
    first token on before the first: a conversation's answer that starts as an earlier answer did)."""
    if schedule.due:
        return True
    return repeats is not None and schedule.since >= schedule.repeat_gap and repeats.at_end(sequence)


class DraftRest:
    """Which rounds of a request ask its lookups where each ask precedes the round's LLM call: a lookup
    request on an LLM that does not stream (each plain token a call of its own, as the torch engine's),
    and a vote's lookups asked ahead of its model SSMs (vote_drafter.py). Each ask is a call through
    Triton before the round's LLM call: where it comes back with nothing worth verifying, the round is a
    plain step that started late, and under load the LLM's dynamic batcher then starts its passes with
    fewer requests (docs/benchmarks.md). So after a round whose draft came back empty, the request rests:
    its rounds decode plainly without asking until a probe would be due on a stream (the same schedule:
    `min_gap` tokens, doubling after each empty ask up to `max_gap`; a repeating tail brings the next ask
    `min_gap` tokens after the last). A draft found ends the rest."""

    def __init__(self, schedule: ProbeSchedule, repeats: TailRepeats | None = None) -> None:
        self.schedule, self.repeats = schedule, repeats
        self.resting = False

    def asks(self, sequence: list[int]) -> bool:
        """Whether the next round continuing `sequence` asks the drafters."""
        return not self.resting or probe_due(self.schedule, self.repeats, sequence)

    def asked(self, found: bool) -> None:
        """A round asked the drafters and `found` a draft worth verifying, or not (a rest begins, or
        the one it ended goes on with a doubled gap)."""
        if found:
            self.resting = False
            return
        if self.resting:
            self.schedule.found_nothing()
        self.resting = True
        self.schedule.probed()

    def arrived(self, tokens: int) -> None:
        self.schedule.arrived(tokens)

    def verified(self, drafted: int, accepted: int) -> None:
        """A verified draft's outcome sets the next rest's first gap (ProbeSchedule.verified)."""
        self.schedule.verified(drafted, accepted)


def aligned(proposal: Proposal, made: list[int]) -> Proposal | None:
    """The proposal less the tokens the stream `made` after the probe's sequence, when it predicted them
    all; None when it did not or nothing is left of it."""
    n = len(made)
    if len(proposal.draft) <= n or proposal.draft[:n] != made:
        return None
    proposal.skip(made)
    return proposal


class DraftWatch:
    """One request's probes over its plain streams (one probe at a time)."""

    def __init__(self, schedule: ProbeSchedule, min_draft: int, ask: Callable[[list[int]], Awaitable[Proposal]],
                 stop: Callable[[], Awaitable[None]] | None, repeats: TailRepeats | None = None,
                 on_end: Callable[[str], None] = lambda outcome: None) -> None:
        """`stop` ends the running stream (None: the LLM cannot be stopped mid-stream; a found draft
        then waits for the stream's own end, a plain stretch). `repeats`: a probe comes without the
        back-off where the sequence's tail repeats (None: by the schedule alone). `on_end` is told
        each probe's outcome (one of PROBE_OUTCOMES) as it ends."""
        self.schedule = schedule
        self.repeats = repeats
        self.min_draft = min_draft
        self._ask, self._stop, self._on_end = ask, stop, on_end
        self._task: asyncio.Task[Proposal | None] | None = None
        self._asked_at = 0
        """Length of the sequence the running probe drafts from."""
        self._stopping = False
        """The running probe found a draft and is stopping the stream: it is waited for, never cancelled."""

    def arrived(self, sequence: list[int], tokens: int, allowed: bool) -> None:
        """`tokens` new tokens have arrived (`sequence` holds them): start a probe if one is due and
        `allowed` (the load permits drafting)."""
        self.schedule.arrived(tokens)
        if self._task is not None and self._task.done() and self._task.result() is None:
            self.schedule.found_nothing()  # (a probe that found a draft stays for settle())
            self._task = None
        if self._task is None and allowed and self._due(sequence):
            self.schedule.probed()
            self._asked_at = len(sequence)
            self._task = asyncio.ensure_future(self._probe(list(sequence)))

    def _due(self, sequence: list[int]) -> bool:
        return probe_due(self.schedule, self.repeats, sequence)

    async def _probe(self, sequence: list[int]) -> Proposal | None:
        try:
            proposal = await self._ask(sequence)
        except asyncio.CancelledError:
            self._on_end("cancelled")
            raise
        if len(proposal.draft) < self.min_draft:
            self._on_end("priced_out" if len(proposal.draft) + proposal.priced_out >= self.min_draft else "empty")
            return None
        self._on_end("found")
        if self._stop is not None:
            self._stopping = True
            await self._stop()
        return proposal

    async def settle(self, sequence: list[int]) -> Proposal | None:
        """After a stream ended: the draft a probe found, aligned to what the stream made since it was
        asked (None: no probe found one, or the stream made other tokens)."""
        task, self._task = self._task, None
        if task is None:
            return None
        if not task.done() and not self._stopping:  # the stream ended on its own: no waiting for a draft
            task.cancel()
        self._stopping = False
        try:
            proposal = await task
        except asyncio.CancelledError:
            return None
        if proposal is None:
            self.schedule.found_nothing()
            return None
        return aligned(proposal, sequence[self._asked_at:])

    async def close(self) -> None:
        """Cancel a probe still running (the request ended) and wait for it."""
        await self.settle([])
