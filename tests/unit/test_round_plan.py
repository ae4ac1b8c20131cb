"""speculation.round_plan: each reason for streaming plain tokens or verifying a draft, one at a time,
with the real length policies and Services."""

from __future__ import annotations

import pytest

from minions.speculation.pricing.draft_length import DraftLengthSelector, FixedLength
from minions.speculation.pricing.gates import probe_pays
from minions.speculation.pricing.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.round_plan import StreamPlain, Verify, plan_round
from minions.speculation.services import Services
from decoding import services_with

SEEDS = LengthPolicy().cost_seed_samples
"""Measures before a drafting cost is known."""


def services(streams: bool = True, load: int = 1, **kw) -> Services:
    return services_with(("ssm",), llm_streams=streams, load=lambda: load, **kw)


def plain_choosing_selector() -> DraftLengthSelector:
    """A selector with no measurements yet, holding s = 0: drafting is free as far as it knows."""
    return DraftLengthSelector(SharedLengthStats(LengthPolicy(candidates=(0, 2, 4), initial=0, explore_every=0)), 4)


def plan(svc, length, drafting=True, first=False, remaining=50, empty=False, lookups_only=False):
    return plan_round(svc, length, drafting=drafting, first=first, remaining=remaining, drafts_came_back_empty=empty,
                      lookups_only=lookups_only)


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


def test_a_request_probed_for_lookup_drafts_streams_from_its_first_token():
    """Its drafters have no prefill to hide behind round 1's call, which only made the stream after
    it begin with another call: it streams from the prompt, as `off` does, until a probe finds a draft."""
    svc = services()
    length = plain_choosing_selector()
    assert plan(svc, length, first=True, lookups_only=True) == StreamPlain(50, 1, watch=True)
    assert plan(svc, length, first=True) == Verify(0, 1, 0), "model SSMs' prefill is drafted during round 1"


def test_a_fixed_length_is_verified_and_cut_to_what_remains():
    svc = services(load=2)
    length = FixedLength(4, svc.length_stats)
    assert plan(svc, length) == Verify(4, 2, 4)
    assert plan(svc, length, remaining=3) == Verify(2, 2, 4), "the LLM's own token is the last of the request"


def test_nothing_left_to_draft_streams_the_last_token():
    svc = services()
    assert plan(svc, FixedLength(4, svc.length_stats), remaining=1) == StreamPlain(1, 1, watch=True)


def test_drafts_that_came_back_empty_stream_the_rest_under_watch_instead_of_a_one_token_call():
    svc = services()
    assert plan(svc, FixedLength(4, svc.length_stats), empty=True) == StreamPlain(50, 1, watch=True)
    assert plan(svc, FixedLength(4, svc.length_stats), empty=True, remaining=5) == StreamPlain(5, 1, watch=True)


def test_an_llm_that_cannot_be_stopped_mid_stream_streams_a_stretch_before_the_next_plan():
    svc = services(llm_stops_streams=False, plain_stretch_tokens=16)
    assert plan(svc, FixedLength(4, svc.length_stats), empty=True) == StreamPlain(16, 1, watch=True)
    assert plan(svc, plain_choosing_selector(), remaining=5) == StreamPlain(5, 1, watch=True)


def test_plain_decoding_chosen_by_the_policy_streams_under_watch():
    svc = services(load=1)
    assert plan(svc, plain_choosing_selector()) == StreamPlain(50, 1, watch=True)


def test_an_llm_that_does_not_stream_gets_a_one_token_call_for_plain_decoding():
    svc = services(streams=False)
    assert plan(svc, plain_choosing_selector()) == Verify(0, 1, 0)


def test_a_draft_a_probe_found_is_verified_next_cut_to_what_remains():
    svc = services(load=2)
    assert plan_round(svc, plain_choosing_selector(), drafting=True, first=False, remaining=50,
                      drafts_came_back_empty=False, found=6) == Verify(6, 2, 6)
    assert plan_round(svc, plain_choosing_selector(), drafting=True, first=False, remaining=4,
                      drafts_came_back_empty=False, found=6) == Verify(3, 2, 6)


def test_above_the_speculation_load_limit_a_drafting_request_streams_plain_tokens():
    busy = services(load=5, speculation_max_load=4)
    assert plan(busy, FixedLength(4, busy.length_stats)) == StreamPlain(50, 5, watch=True)
    assert plan(busy, FixedLength(4, busy.length_stats), first=True) == StreamPlain(50, 5, watch=True), \
        "from its first token on, as `off`: no call of its own for round 1, whose early draft would go unused"
    assert not probe_pays(busy.settings, busy.length_stats, FixedLength(4, busy.length_stats), 5), \
        "its stream's probes are off too"
    calm = services(load=4, speculation_max_load=4)
    assert plan(calm, FixedLength(4, calm.length_stats)) == Verify(4, 4, 4)
    assert plan(calm, FixedLength(4, calm.length_stats), first=True) == Verify(0, 4, 0)
    unlimited = services(load=64)
    assert plan(unlimited, FixedLength(4, unlimited.length_stats)) == Verify(4, 64, 4)


def test_a_streams_interval_grows_with_the_load_so_that_all_streams_send_at_most_the_rate():
    svc = services(load=1, llm_stream_max_responses_per_s=80.0)
    assert svc.stream_interval_s(0.1, 1) == svc.stream_interval_s(0.1, 8) == 0.1
    assert svc.stream_interval_s(0.1, 16) == pytest.approx(0.2)
    assert svc.stream_interval_s(0.0, 16) == 0.0, "every token, when asked for, stays every token"
    assert services(load=1, llm_stream_max_responses_per_s=0.0).stream_interval_s(0.1, 64) == 0.1


def test_a_model_ssms_slow_and_rejected_drafts_do_not_close_the_lookup_drafters_probes():
    """Drafting's cost and acceptance are kept per set of SSMs: on the Qwen deployment one request that
    named the 0.5B model (18 ms a draft token) closed the probes of every later lookup-only request, for
    good (a closed probe drafts nothing, so no new sample could reopen it), and its rejected drafts
    made the lookups' next requests pick 1-token drafts."""
    svc = services(load=1)
    lookups, model = ("ssm_ngram", "ssm_suffix"), ("ssm_qwen05",)
    for _ in range(SEEDS):  # enough measures to be known
        FixedLength(4, svc.length_stats, drafters=model).observe(1, 4, 1, 0.072, 0.3)
    assert not probe_pays(svc.settings, svc.length_stats, FixedLength(0, svc.length_stats, drafters=model), 1)
    prior = svc.length_stats.global_rates(4)  # nothing measured
    assert svc.length_stats.global_rates(4, lookups) == prior != svc.length_stats.global_rates(4, model)
    assert probe_pays(svc.settings, svc.length_stats, FixedLength(0, svc.length_stats, drafters=lookups), 1)
    for _ in range(SEEDS):
        FixedLength(8, svc.length_stats, drafters=lookups).observe(1, 8, 8, 0.0026, 0.3)
    assert probe_pays(svc.settings, svc.length_stats, FixedLength(0, svc.length_stats, drafters=lookups), 1)


def test_short_drafts_cost_per_token_does_not_close_the_probes():
    """A lookup call costs about 2.5 ms whatever its length: a request exploring 1-token drafts from
    s = 0 measured 2.5 ms a token, above the probes' 1 ms, and the probes that would have measured it
    again stayed closed. The gate reads drafts at least as long as a probe must find."""
    svc = services(load=1)
    lookups = ("ssm_ngram", "ssm_suffix")
    for _ in range(5):
        FixedLength(1, svc.length_stats, drafters=lookups).observe(1, 1, 0, 0.0025, 0.1)
    assert svc.length_stats.draft_estimate(1, False, lookups) > svc.settings.probe.max_draft_cost_ms / 1000
    assert probe_pays(svc.settings, svc.length_stats, FixedLength(0, svc.length_stats, drafters=lookups), 1)
    for _ in range(SEEDS):
        FixedLength(8, svc.length_stats, drafters=lookups).observe(1, 8, 8, 0.0030, 0.3)
    assert probe_pays(svc.settings, svc.length_stats, FixedLength(0, svc.length_stats, drafters=lookups), 1)
    model = ("ssm_q4",)
    for _ in range(SEEDS):
        FixedLength(4, svc.length_stats, drafters=model).observe(1, 4, 2, 0.024, 0.3)
    assert not probe_pays(svc.settings, svc.length_stats, FixedLength(0, svc.length_stats, drafters=model), 1)
