"""What the next round of a request does, decided before it runs: stream plain tokens from one LLM
call (`StreamPlain`), or draft and verify (`Verify`, with no draft: one plain token from one call).

The decision reads like tensorrtllm_backend's `_spec_generate` stop conditions, one named reason per
line, so the loop (loop.py) only runs the plan it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from minions.speculation.pricing.draft_length import DraftLengthSelector, FixedLength
from minions.speculation.pricing.gates import too_busy
from minions.speculation.services import Services


@dataclass(frozen=True)
class StreamPlain:
    """Stream up to `tokens` plain tokens from one call to a streaming LLM, each a round of its own."""

    tokens: int
    batch: int
    """Requests decoding when the round was planned (what the length policy learns against)."""
    watch: bool = False
    """The request drafts: its drafters are probed while the tokens stream (watch.py), and a draft
    worth verifying ends the stream early."""


@dataclass(frozen=True)
class Verify:
    """Draft up to `k` tokens and verify them in one LLM call (k = 0: one plain token, as the prompt's
    prefill in round 1 or on an LLM that does not stream)."""

    k: int
    batch: int
    planned: int
    """The length policy's choice (k may be shorter: fewer tokens remain), or the length of the draft a
    probe found while plain tokens streamed."""


RoundPlan = StreamPlain | Verify


def plan_round(services: Services, length: DraftLengthSelector | FixedLength, *, drafting: bool, first: bool,
               remaining: int, drafts_came_back_empty: bool, found: int = 0, lookups_only: bool = False) -> RoundPlan:
    """The next round's plan. `drafting`: the request has a drafter and asks it this round (on an LLM
    that does not stream, a lookup request resting after an empty draft does not: watch.DraftRest);
    `first`: nothing emitted yet (round 1 is plain decoding, so the first token costs one LLM prefill,
    as in `off`);
    `drafts_came_back_empty`: the last Verify found nothing worth verifying; `found`: the length of
    a draft a probe found during the last plain stream (0: none); `lookups_only`: the request's
    drafters are lookups and its length adaptive (it is probed). Above `speculation_max_load`
    requests decoding, a drafting request decodes plainly (s = 0), from its first token on."""
    batch = services.load()
    if found:
        return Verify(min(found, remaining - 1), batch, found)
    busy = too_busy(services.settings, batch)
    planned = length.choose(batch) if drafting and not first and not busy else 0
    k = min(planned, remaining - 1)
    if services.llm_streams:
        plain_request = not drafting  # `off`: the whole output from one call
        if plain_request:
            return StreamPlain(remaining, batch)
        # Round 1 is a call of its own so that its early draft of round 2 takes the SSMs' prefill of
        # the prompt off the critical path. Lookups have no prefill worth it, and the stream after
        # that call began with another call (docs/benchmarks.md, "Fresh servers that drafted no
        # copy"): their request streams from its first token as `off` does, as does every request
        # above the load limit, where nothing is drafted.
        nothing_to_verify = drafts_came_back_empty or (k == 0 and not first) or (first and (busy or lookups_only))
        if nothing_to_verify:  # until the request ends or a probe finds a draft (and stops the stream)
            stretch = remaining if services.llm_stops_streams else min(remaining, services.settings.plain_stretch_tokens)
            return StreamPlain(stretch, batch, watch=True)
    return Verify(k, batch, planned)
