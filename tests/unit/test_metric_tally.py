"""serving/metric_tally.py: rounds and requests become per-series sums, handed over once per drain."""

from __future__ import annotations

from minions.serving.metric_tally import MetricTally, series
from minions.speculation.rounds import Round


def _round(**kw) -> Round:
    base = dict(tokens=[5, 6, 7], ssm="ssm_a", drafted=3, accepted=2, draft_seconds=0.0, verify_seconds=0.0,
                drafts={"ssm_a": [5, 6, 9], "ssm_b": [4]}, control_seconds=0.001)
    return Round(**(base | kw))


def test_rounds_sum_per_series_until_drained():
    tally = MetricTally()
    tally.observe_round(_round(), "vote")
    tally.observe_round(_round(failed=("ssm_b",)), "vote")
    counters, gauges, _ = tally.drain()
    assert gauges == {}
    assert counters[series("minions_num_rounds", speculation="vote")] == 2
    assert counters[series("minions_num_llm_calls", speculation="vote")] == 2
    assert counters[series("minions_spec_decode_num_emitted_tokens", ssm="ssm_a")] == 6
    assert counters[series("minions_spec_decode_num_accepted_tokens", ssm="ssm_a")] == 4
    assert counters[series("minions_spec_decode_num_accepted_tokens_per_pos", ssm="ssm_a", position="1")] == 2
    assert series("minions_spec_decode_num_accepted_tokens_per_pos", ssm="ssm_a", position="2") not in counters
    assert counters[series("minions_ssm_matched_tokens", ssm="ssm_a")] == 4
    assert counters[series("minions_ssm_matched_tokens", ssm="ssm_b")] == 0  # the series exists, at 0
    assert counters[series("minions_ssm_failures", ssm="ssm_b")] == 1
    assert abs(counters[series("minions_control_seconds", speculation="vote")] - 0.002) < 1e-12
    assert not tally and tally.drain() == ({}, {}, {})


def test_a_plain_token_counts_as_an_undrafted_round():
    tally = MetricTally()
    tally.observe_round(_round(tokens=[1], ssm=None, drafted=0, accepted=0, drafts={}, control_seconds=0.0), "off")
    counters, _, _ = tally.drain()
    assert counters == {series("minions_num_rounds", speculation="off"): 1,
                        series("minions_num_llm_calls", speculation="off"): 1,
                        series("minions_spec_decode_num_emitted_tokens", ssm="none"): 1}


def test_a_streamed_token_after_the_first_is_a_round_but_no_llm_call():
    tally = MetricTally()
    for first in (True, False, False):
        tally.observe_round(_round(tokens=[1], ssm=None, drafted=0, accepted=0, drafts={}, control_seconds=0.0,
                                   llm_call=first), "off")
    counters, _, _ = tally.drain()
    assert counters[series("minions_num_rounds", speculation="off")] == 3
    assert counters[series("minions_num_llm_calls", speculation="off")] == 1


def test_requests_and_latest_weights():
    tally = MetricTally()
    tally.observe_request("vote", "success", 1.5)
    tally.observe_request("vote", "success", 0.5)
    tally.observe_request("vote", "invalid")
    tally.observe_weights({"ssm_a": 0.3})
    tally.observe_weights({"ssm_a": 0.7})
    counters, gauges, _ = tally.drain()
    assert counters[series("minions_requests", speculation="vote", outcome="success")] == 2
    assert counters[series("minions_requests", speculation="vote", outcome="invalid")] == 1
    assert counters[series("minions_request_seconds", speculation="vote")] == 2.0
    assert gauges == {series("minions_ssm_weight", ssm="ssm_a"): 0.7}


def test_probes_are_counted_by_outcome():
    tally = MetricTally()
    for outcome in ("empty", "empty", "found"):
        tally.observe_probe(outcome)
    counters, _, _ = tally.drain()
    assert counters == {series("minions_probes", outcome="empty"): 2, series("minions_probes", outcome="found"): 1}


def test_latencies_are_observed_per_request_as_vllms_histograms():
    tally = MetricTally()
    tally.observe_latency("vote", 0.12, 0.03, 1.5)
    tally.observe_latency("vote", 0.20, None, 0.2)  # one token: no time per output token
    assert tally
    _, _, observations = tally.drain()
    assert observations == {
        series("minions_time_to_first_token_seconds", speculation="vote"): [0.12, 0.20],
        series("minions_time_per_output_token_seconds", speculation="vote"): [0.03],
        series("minions_e2e_request_latency_seconds", speculation="vote"): [1.5, 0.2],
    }
    assert not tally
