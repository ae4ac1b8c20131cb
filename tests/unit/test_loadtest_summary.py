"""loadtest's pure parts: per-request ITL, outcomes of failures, percentiles, goodput, series over time,
and the options handed from the runner to Locust."""

from __future__ import annotations

import argparse

import pytest

from client.api import MinionsClientError, SilentStreamError
from loadtest.options import OPTIONS, add_options, option_args
from loadtest.records import ERROR, OK, TIMEOUT, UNAVAILABLE, RequestRecord, append_record, outcome_of, read_records
from loadtest.summary import Targets, format_markdown, percentiles, series, summarize


def ok(start: float, ttft: float, e2e: float, tokens: int, protocol: str = "grpc") -> RequestRecord:
    return RequestRecord(protocol, start, e2e, OK, ttft_s=ttft, output_tokens=tokens, chunks=tokens)


def failed(start: float, e2e: float, outcome: str, protocol: str = "http") -> RequestRecord:
    return RequestRecord(protocol, start, e2e, outcome, error=f"{outcome} happened")


def test_itl_is_the_mean_gap_between_tokens_after_the_first():
    assert ok(0.0, 0.2, 1.2, 11).itl_s == pytest.approx(0.1)
    assert ok(0.0, 0.2, 0.2, 1).itl_s is None  # one token: no gap
    assert failed(0.0, 1.0, ERROR).itl_s is None


@pytest.mark.parametrize("exc, outcome", [
    (SilentStreamError("no response from minions for 60 s"), TIMEOUT),
    (MinionsClientError("busy", 503), UNAVAILABLE),
    (MinionsClientError("slow down", 429), UNAVAILABLE),
    (MinionsClientError("[StatusCode.UNAVAILABLE] queue full", "StatusCode.UNAVAILABLE"), UNAVAILABLE),
    (MinionsClientError("[StatusCode.RESOURCE_EXHAUSTED] too many", "StatusCode.RESOURCE_EXHAUSTED"), UNAVAILABLE),
    # gRPC gives a server it cannot reach the same status: a dead server is an error, not a refusal
    (MinionsClientError("[StatusCode.UNAVAILABLE] failed to connect to all addresses", "StatusCode.UNAVAILABLE"),
     ERROR),
    (MinionsClientError("[StatusCode.UNAVAILABLE] Stream removed (Socket closed)", "StatusCode.UNAVAILABLE"), ERROR),
    (MinionsClientError("'top_p' must be in (0, 1]", 400), ERROR),
    (MinionsClientError("in-stream error without a status"), ERROR),
    # Minions' own refusal arrives inside a stream, without a status: told by its message
    (MinionsClientError("the server is at capacity (16 requests decoding, 64 waiting, the most it queues): "
                        "retry later"), UNAVAILABLE),
    (ConnectionRefusedError(111, "Connection refused"), ERROR),
])
def test_failures_are_told_apart(exc, outcome):
    assert outcome_of(exc) == outcome


def test_percentiles_interpolate_and_are_none_without_values():
    stats = percentiles([float(v) for v in range(1, 101)])
    assert stats == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01, "mean": 50.5})
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_a_request_meets_the_targets_only_when_it_succeeded_within_both():
    targets = Targets(ttft_ms=500.0, itl_ms=50.0)
    assert targets.met_by(ok(0.0, 0.5, 1.5, 21))  # TTFT 500 ms, ITL 50 ms: on the line counts
    assert not targets.met_by(ok(0.0, 0.6, 1.5, 21))  # TTFT over
    assert not targets.met_by(ok(0.0, 0.1, 2.1, 21))  # ITL 100 ms
    assert targets.met_by(ok(0.0, 0.1, 0.1, 1))  # one token: no ITL to miss
    assert not targets.met_by(failed(0.0, 0.1, UNAVAILABLE))
    assert not targets.met_by(RequestRecord("grpc", 0.0, 1.0, OK, ttft_s=None, output_tokens=0))  # no text


def test_summary_counts_outcomes_and_goodput_is_good_requests_per_second_of_the_run():
    records = [
        ok(100.0, 0.1, 1.1, 11),  # good
        ok(101.0, 0.9, 1.9, 11),  # TTFT over the target
        ok(102.0, 0.2, 3.2, 11),  # ITL 300 ms
        ok(104.9, 0.1, 1.1, 11, protocol="http"),  # good, ends last at 106
        failed(103.0, 0.5, UNAVAILABLE),
        failed(103.5, 0.5, TIMEOUT),
        failed(104.0, 0.5, ERROR, protocol="grpc"),
    ]
    s = summarize(records, Targets(ttft_ms=500.0, itl_ms=200.0))
    assert (s["requests"], s["succeeded"], s["failed"]) == (7, 4, 3)
    assert (s["unavailable"], s["timeouts"], s["errors"]) == (1, 1, 1)
    assert s["by_protocol"] == {"grpc": {"requests": 4, "failed": 1}, "http": {"requests": 3, "failed": 2}}
    assert s["duration_s"] == pytest.approx(6.0)
    assert s["requests_per_s"] == pytest.approx(4 / 6)
    assert s["output_tokens"] == 44 and s["output_tokens_per_s"] == pytest.approx(44 / 6)
    assert s["goodput"]["good_requests"] == 2
    assert s["goodput"]["requests_per_s"] == pytest.approx(2 / 6)
    assert s["goodput"]["share"] == pytest.approx(2 / 7)
    assert s["ttft_ms"]["p50"] == pytest.approx(150.0)  # successful requests only
    assert s["e2e_ms"]["mean"] == pytest.approx(1000 * (1.1 + 1.9 + 3.2 + 1.1) / 4)
    assert s["first_errors"] == ["unavailable happened", "timeout happened", "error happened"]
    text = format_markdown(s)
    assert "7 requests in 6.0 s" in text and "1 refused as unavailable" in text and "TTFT ≤ 500 ms" in text


def test_series_spreads_tokens_over_each_stream_and_keeps_them_all():
    records = [
        ok(0.0, 1.0, 3.0, 20),  # 20 tokens from t=1 to t=3: 10 in each of buckets 1 and 2
        ok(0.5, 0.5, 3.0, 9),  # 9 tokens over 1..3.5 (the last bucket, 3..3.5, is half a second)
        failed(2.0, 0.2, ERROR),
    ]
    rows = series(records, width_s=1.0)
    assert [r["t_s"] for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert [r["ended"] for r in rows] == [0, 0, 1, 2] and [r["failed"] for r in rows] == [0, 0, 1, 0]
    assert rows[1]["output_tokens_per_s"] == pytest.approx(10 + 9 * 1 / 2.5)
    assert rows[3]["output_tokens_per_s"] == pytest.approx((9 * 0.5 / 2.5) / 0.5)  # over its half second
    widths = [1.0, 1.0, 1.0, 0.5]
    assert sum(r["output_tokens_per_s"] * w for r, w in zip(rows, widths)) == pytest.approx(29)
    assert rows[3]["ttft_ms_p50"] == pytest.approx(750.0) and rows[2]["ttft_ms_p50"] is None
    assert series([]) == []


def test_records_round_trip_through_the_jsonl_file(tmp_path):
    path = tmp_path / "requests.jsonl"
    records = [ok(1.0, 0.1, 1.0, 5), failed(2.0, 0.5, TIMEOUT)]
    for r in records:
        append_record(path, r)
    assert read_records(path) == records
    assert read_records(tmp_path / "absent.jsonl") == []


def test_the_runner_hands_every_option_to_locust_unchanged():
    parser = argparse.ArgumentParser()
    add_options(parser)
    values = parser.parse_args(["--max-tokens", "16", "--speculation", "", "--datasets", "code_edit",
                                "--temperature", "0.7"])
    again = parser.parse_args(option_args(values))
    assert vars(again) == vars(values)
    assert {o.name for o in OPTIONS} == set(vars(values))
    assert values.speculation == "" and values.max_tokens == 16
