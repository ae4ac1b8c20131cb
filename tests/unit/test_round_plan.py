"""speculation.round_plan: each reason for streaming plain tokens or verifying a draft, one at a time,
with the real length policies and Services."""

from __future__ import annotations

import pytest

from minions.settings import DEFAULTS
from minions.speculation.draft_length import DraftLengthSelector, FixedLength
from minions.speculation.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.round_plan import StreamPlain, Verify, plan_round
from minions.speculation.services import Services


def services(streams: bool = True, load: int = 1, **kw) -> Services:
    return Services(ssms=("ssm",), llm_streams=streams, load=lambda: load, **kw)


def plain_choosing_selector() -> DraftLengthSelector:
    """A selector with no measurements yet, holding s = 0: drafting is free as far as it knows."""
    return DraftLengthSelector(SharedLengthStats(LengthPolicy(candidates=(0, 2, 4), initial=0, explore_every=0)), 4)


def plan(svc, length, drafting=True, first=False, remaining=50, empty=False):
    return plan_round(svc, length, drafting=drafting, first=first, remaining=remaining, drafts_came_back_empty=empty)


def test_off_on_a_streaming_llm_streams_everything_left_from_one_call():
    svc = services(load=3)
    assert plan(svc, FixedLength(0, svc.length_stats), drafting=False, first=True, remaining=40) == StreamPlain(40, 3)
    assert plan(svc, FixedLength(0, svc.length_stats), drafting=False, remaining=7) == StreamPlain(7, 3)


def test_off_on_an_llm_that_does_not_stream_asks_one_plain_token_per_call():
    svc = services(streams=False)
    assert plan(svc, FixedLength(0, svc.length_stats), drafting=False) == Verify(0, 1, 0)


def test_round_one_is_the_prompts_prefill_without_a_draft():
    svc = services()
    length = FixedLength(4, svc.length_stats)
    assert plan(svc, length, first=True) == Verify(0, 1, 0), "the first token costs one prefill, as in `off`"


def test_a_fixed_length_is_verified_and_cut_to_what_remains():
    svc = services(load=2)
    length = FixedLength(4, svc.length_stats)
    assert plan(svc, length) == Verify(4, 2, 4)
    assert plan(svc, length, remaining=3) == Verify(2, 2, 4), "the LLM's own token is the last of the request"


def test_nothing_left_to_draft_streams_the_last_token():
    svc = services()
    assert plan(svc, FixedLength(4, svc.length_stats), remaining=1) == StreamPlain(1, 1)


def test_drafts_that_came_back_empty_stream_a_stretch_instead_of_a_one_token_call():
    svc = services()
    assert plan(svc, FixedLength(4, svc.length_stats), empty=True) == StreamPlain(svc.plain_stretch, 1)
    assert plan(svc, FixedLength(4, svc.length_stats), empty=True, remaining=5) == StreamPlain(5, 1)


def test_plain_decoding_chosen_by_the_policy_probes_nearly_free_drafters_at_low_load():
    svc = services(load=1)
    got = plan(svc, plain_choosing_selector())
    assert got == Verify(svc.probe_tokens, 1, 0, probe=True)


@pytest.mark.parametrize("why", ["too busy", "came back empty", "no streaming", "probes off"])
def test_without_a_probe_plain_decoding_streams_a_stretch(why):
    load = DEFAULTS.probe_max_load + 1 if why == "too busy" else 1
    svc = services(load=load, streams=why != "no streaming",
                   probe_tokens=0 if why == "probes off" else 8)
    got = plan(svc, plain_choosing_selector(), empty=why == "came back empty")
    if why == "no streaming":
        assert got == Verify(0, 1, 0), "an LLM that does not stream gets a one-token call"
    else:
        assert got == StreamPlain(svc.plain_stretch, svc.load())

