"""benchmarks.chaos, its pure parts: the seeded fault schedule, how a request's ending is classified,
the memory-trend verdict, leaked regions, crash lines, the requests around a fault and the problems a
report fails on."""

from __future__ import annotations

import http.client
import itertools
import urllib.error

import httpx2
import openai
import pytest

from benchmarks.chaos.run import Settings, parse_args
from benchmarks.chaos.schedule import FAULT_KINDS, fault_deck, fault_schedule, parse_faults
from benchmarks.chaos.verdict import (FAILED, HUNG, INCOMPLETE, MODES, ORPHANED, OUTCOMES, PROTOCOLS, REFUSED, SERVED,
                                      RequestResult, classify, crash_lines, duration_figures, leaked_regions,
                                      memory_trend, orphaned, problems, slow_requests, uncovered, window_outcomes)
from client.api import Completion, MinionsClientError, SilentStreamError
from minions.errors import ServerBusy
from minions.frontend.orphans import ORPHANED as ORPHAN_MESSAGE

MIB = 2**20
SSMS = ("ssm_ngram", "ssm_suffix")


def deck(kinds=FAULT_KINDS):
    return fault_deck(kinds, "llm", "minions", SSMS)


# -- fault kinds and schedule ------------------------------------------------------------------------
def test_fault_kinds_parse_in_a_fixed_order_and_unknown_ones_are_named():
    assert parse_faults("reload, ssm_kill") == ("ssm_kill", "reload")
    assert parse_faults(",".join(FAULT_KINDS)) == FAULT_KINDS
    with pytest.raises(ValueError, match="'gpu_kill'"):
        parse_faults("ssm_kill,gpu_kill")
    with pytest.raises(ValueError):
        parse_faults(" , ")


def test_the_deck_holds_a_kill_per_ssm_and_a_reload_per_model():
    assert deck() == [("ssm_kill", "ssm_ngram"), ("ssm_kill", "ssm_suffix"), ("llm_kill", "llm"),
                      ("minions_kill", "minions"), ("reload", "llm"), ("reload", "minions"),
                      ("reload", "ssm_ngram"), ("reload", "ssm_suffix")]
    assert deck(("ssm_kill", "reload")) == [p for p in deck() if p[0] in ("ssm_kill", "reload")]


def test_the_schedule_is_the_seed_s_alone():
    def first(seed):
        return list(itertools.islice(fault_schedule(seed, deck(), 10, 40), 30))

    assert first(7) == first(7)
    assert first(7) != first(8)


def test_every_fault_comes_once_before_any_comes_again():
    faults = list(itertools.islice(fault_schedule(3, deck(), 1, 2), 3 * len(deck())))
    for start in range(0, len(faults), len(deck())):
        dealt = [(f.kind, f.model) for f in faults[start:start + len(deck())]]
        assert sorted(dealt) == sorted(deck())
    assert [(f.kind, f.model) for f in faults[:8]] != deck()  # shuffled


@pytest.mark.parametrize("seed", range(20))
def test_the_first_faults_are_one_of_each_kind(seed):
    faults = list(itertools.islice(fault_schedule(seed, deck(), 1, 2), len(FAULT_KINDS)))
    assert sorted(f.kind for f in faults) == sorted(FAULT_KINDS)


def test_gaps_are_drawn_from_the_range_and_only_chosen_kinds_come():
    faults = list(itertools.islice(fault_schedule(1, deck(("ssm_kill", "reload")), 5, 9), 200))
    assert all(5 <= f.gap_s <= 9 for f in faults)
    assert max(f.gap_s for f in faults) - min(f.gap_s for f in faults) > 2  # spread, not one value
    assert {f.kind for f in faults} == {"ssm_kill", "reload"}
    with pytest.raises(ValueError):
        next(fault_schedule(1, [], 1, 2))


# -- outcomes ----------------------------------------------------------------------------------------
def test_a_request_is_served_only_with_its_final_response():
    assert classify(Completion(text="hi", chunks=["hi"], finish_reason="length"), None) == (SERVED, "length")
    outcome, detail = classify(Completion(text="hi", chunks=["h", "i"]), None)
    assert outcome == INCOMPLETE and "after 2 chunks without a final response" in detail


def test_refusals_are_by_status_or_by_the_busy_message():
    busy = f"{ServerBusy.PREFIX} (16 requests decoding, 64 waiting, the most it queues): retry later"
    assert classify(None, MinionsClientError(busy))[0] == REFUSED  # inside a gRPC stream: no status
    assert classify(None, MinionsClientError(busy, 400))[0] == REFUSED  # Triton's generate_stream
    assert classify(None, MinionsClientError("overloaded", 503))[0] == REFUSED
    assert classify(None, MinionsClientError("overloaded", "StatusCode.UNAVAILABLE"))[0] == REFUSED


def test_errors_with_a_message_are_failures_and_a_lost_connection_is_not_a_refusal():
    dead = "engine model 'llm' failed: Stub process 'llm_0_0' is not healthy."
    assert classify(None, MinionsClientError(dead)) == (FAILED, dead)
    assert classify(None, MinionsClientError(dead, 400))[0] == FAILED
    lost = MinionsClientError("failed to connect to all addresses", "StatusCode.UNAVAILABLE")
    assert classify(None, lost)[0] == FAILED
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    assert classify(None, refused)[0] == FAILED


def test_silence_is_a_hang_and_a_broken_stream_is_incomplete():
    assert classify(None, SilentStreamError("no response from minions for 120 s"))[0] == HUNG
    assert classify(None, http.client.IncompleteRead(b""))[0] == INCOMPLETE
    assert classify(None, ConnectionResetError(104, "Connection reset by peer"))[0] == INCOMPLETE
    assert classify(None, MinionsClientError(""))[0] == INCOMPLETE


def test_the_openai_clients_endings_are_classified_as_the_others():
    """The `openai` package's exceptions: its read timeout is silence, a 503 a refusal, an error event
    the server's message (ORPHANED's too: a clear error), a refused connection a failure."""
    request = httpx2.Request("POST", "http://127.0.0.1:9000/v1/chat/completions")
    assert classify(None, openai.APITimeoutError(request))[0] == HUNG
    busy = httpx2.Response(503, request=request)
    assert classify(None, openai.APIStatusError("the server is at capacity", response=busy, body=None))[0] == REFUSED
    bad = httpx2.Response(400, request=request)
    assert classify(None, openai.APIStatusError("'max_tokens' must be", response=bad, body=None))[0] == FAILED
    assert classify(None, openai.APIError(ORPHAN_MESSAGE, request, body=None)) == (FAILED, ORPHAN_MESSAGE)
    refused = openai.APIConnectionError(request=request)
    refused.__cause__ = httpx2.ConnectError("[Errno 111] Connection refused")
    assert classify(None, refused)[0] == FAILED
    broken = openai.APIConnectionError(request=request)
    broken.__cause__ = httpx2.RemoteProtocolError("peer closed connection without sending complete message body")
    assert classify(None, broken)[0] == INCOMPLETE


def test_a_triton_client_hung_under_way_at_an_orchestrator_kill_is_orphaned_and_nothing_else_is():
    def hung(protocol, start, end, outcome=HUNG):
        return RequestResult(0, protocol, "off", start, end, outcome, "silent")

    results = [hung("grpc", 5, 130), hung("http", 8, 131), hung("openai", 6, 130),  # at the kill at 10
               hung("grpc", 12, 140),  # sent after it
               hung("grpc", 1, 9),  # ended before it
               hung("grpc", 5, 12, outcome=FAILED)]  # ended, with an error
    marked = [r.outcome for r in orphaned(results, kills=[10.0])]
    assert marked == [ORPHANED, ORPHANED, HUNG, HUNG, HUNG, FAILED]
    assert [r.outcome for r in orphaned(results, kills=[])] == [r.outcome for r in results]


# -- memory, shared memory, crashes ------------------------------------------------------------------
def samples(values, every=5.0, unsettled=()):
    return [(i * every, v, i not in unsettled) for i, v in enumerate(values)]


def test_memory_is_judged_after_warm_up_only():
    climb_in_warmup = [500 * MIB + i * 100 * MIB for i in range(12)] + [1700 * MIB] * 6  # 12 samples in 60 s
    assert not memory_trend(samples(climb_in_warmup), warmup_s=60, growth_bytes=64 * MIB).growing
    assert memory_trend(samples(climb_in_warmup), warmup_s=0, growth_bytes=64 * MIB).growing


def test_steady_growth_beyond_the_threshold_fails_and_a_step_or_a_small_climb_does_not():
    steady = [1500 * MIB + i * 30 * MIB for i in range(18)]  # +510 MiB: beyond 10% of 1.5 GiB
    assert memory_trend(samples(steady), 0, 128 * MIB).growing
    small = [1500 * MIB + i * 5 * MIB for i in range(18)]  # +85 MiB: below max(128 MiB, 10%)
    assert not memory_trend(samples(small), 0, 128 * MIB).growing
    step = [1500 * MIB] * 6 + [1900 * MIB] * 12  # a reload's arena, once
    assert not memory_trend(samples(step), 0, 128 * MIB).growing
    assert "GROWING" in str(memory_trend(samples(steady), 0, 128 * MIB))


def test_samples_taken_while_a_fault_is_unsettled_are_not_judged():
    # a killed orchestrator's 400 MiB are gone until it is back, and a model reloading has two
    # instances: neither is a climb
    faults = [1100 * MIB] * 8 + [1300 * MIB] * 8 + [1500 * MIB] * 8
    assert memory_trend(samples(faults), 0, 128 * MIB).growing
    assert not memory_trend(samples(faults, unsettled=range(16)), 0, 128 * MIB).growing


def test_too_few_samples_after_warm_up_are_not_judged():
    assert memory_trend(samples([MIB] * 20), warmup_s=90, growth_bytes=MIB) is None


def test_a_leaked_region_is_ours_present_and_mapped_by_no_one():
    ours = {"r1", "r2", "r3", "r4"}
    present = {"r1", "r2", "r3", "other"}
    mapped = {"r1", "other"}
    assert leaked_regions(ours, present, mapped) == ["r2", "r3"]


def test_crash_lines_are_signals_and_fatal_python_errors():
    log = ("I1125 model_lifecycle.cc:839] \"successfully loaded 'llm'\"\n"
           "Signal (11) received.\n"
           "Fatal Python error: Segmentation fault\n"
           "W1125 minions.engines: Stub process 'ssm_ngram_0_0' is not healthy.\n")
    assert crash_lines(log) == ["Signal (11) received.", "Fatal Python error: Segmentation fault"]


# -- the verdict -------------------------------------------------------------------------------------
def clean_report(**changes) -> dict:
    report = {
        "settings": {"recovery_s": 90, "hang_s": 120, "slow_s": 60},
        "requests": {"total": 10, "outcomes": dict.fromkeys(OUTCOMES, 0) | {SERVED: 8, REFUSED: 1, FAILED: 1},
                     "examples": {}, "slow": []},
        "server": {"exited_during_run": None, "crash_lines": [], "exit_code": 1},
        "faults": [{"kind": "ssm_kill", "model": "ssm_ngram", "t": 12.0, "recovered_s": 4.2, "error": None,
                    "restored": None, "served_again_s": 1.5}],
        "shm": {"leaked": [], "left_after_stop": [], "killed_stubs_left_after_stop": ["r9"]},
        "stubs_after_stop": [],
        "memory": {"verdict": "tritonserver + stubs RSS: 1500.0 -> 1510.0 MiB (flat)"},
        "warnings": [],
    }
    for key, value in changes.items():
        head, _, tail = key.partition("__")
        if tail:
            report[head] = {**report[head], tail: value}
        else:
            report[key] = value
    return report


def test_a_clean_run_has_no_problem():
    # refusals, failures with a message, Triton's exit code 1 after a killed stub, and the killed
    # stubs' regions it leaves at exit are reported, not failed on
    assert problems(clean_report()) == []


@pytest.mark.parametrize("change, expected", [
    ({"requests__outcomes": dict.fromkeys(OUTCOMES, 0) | {HUNG: 2}}, "2 request(s) hung"),
    ({"requests__outcomes": dict.fromkeys(OUTCOMES, 0) | {INCOMPLETE: 1}}, "ended without a final response"),
    ({"requests__total": 0}, "no request was made"),
    ({"server__exited_during_run": -11}, "tritonserver exited during the run with code -11"),
    ({"server__crash_lines": ["Signal (11) received."]}, "crash in tritonserver's log: Signal (11)"),
    ({"server__exit_code": -9}, "did not stop by itself"),
    ({"faults": [{"kind": "llm_kill", "model": "llm", "t": 30.0, "recovered_s": None, "error": None,
                  "restored": "loaded the model again", "served_again_s": 95.0}]},
     "llm_kill llm at 30 s: its stub was still dead after 90 s"),
    ({"faults": [{"kind": "reload", "model": "llm", "t": 30.0, "recovered_s": None,
                  "error": "load_model failed: boom", "restored": None, "served_again_s": None}]},
     "reload llm at 30 s: load_model failed"),
    ({"faults": [{"kind": "minions_kill", "model": "minions", "t": 30.0, "recovered_s": 5.0, "error": None,
                  "restored": None, "served_again_s": None}]},
     "minions_kill minions at 30 s: no request sent after it was served within 210 s"),
    ({"faults": [{"kind": "reload", "model": "llm", "t": 30.0, "recovered_s": 8.9, "error": None,
                  "restored": None, "served_again_s": 76.2}]},
     "reload llm at 30 s: a request sent after it was served only 76.2 s after it (more than 60 s)"),
    ({"requests__slow": [{"seconds": 72.3, "what": "[grpc vote at 410 s] served after 72.3 s, 64 tokens"},
                         {"seconds": 196.0, "what": "[http off at 400 s] failed after 196.0 s, 12 tokens"}]},
     "2 request(s) took more than 60 s to end (the longest 196.0 s): [grpc vote at 410 s] served after 72.3 s"),
    ({"shm__leaked": ["r2"]}, "shared memory leaked (no live process maps it) once the load stopped: r2"),
    ({"shm__left_after_stop": ["r3"]}, "shared memory left in /dev/shm after the stop: r3"),
    ({"stubs_after_stop": ["llm (pid 7)"]}, "stub still running after tritonserver exited: llm (pid 7)"),
    ({"memory__verdict": "tritonserver + stubs RSS: 1500.0 -> 2100.0 MiB (GROWING)"}, "memory grew steadily"),
    ({"uncovered": ["no reload fault"]}, "the run ended at --max-minutes with no reload fault"),
])
def test_each_problem_fails_the_run_with_one_line(change, expected):
    found = problems(clean_report(**change))
    assert len(found) == 1 and expected in found[0], found


def test_a_request_is_slow_by_its_time_to_end_however_it_ended_but_hung_ones_are_counted_as_hung():
    def req(start, end, outcome):
        return RequestResult(0, "http", "off", start, end, outcome, "")

    fast, crawled, failed_late = req(0, 9, SERVED), req(10, 80, SERVED), req(20, 90.5, FAILED)
    hung, orphaned_ = req(0, 130, HUNG), req(5, 135, ORPHANED)
    results = [fast, crawled, failed_late, hung, orphaned_, req(30, 90, REFUSED)]  # exactly 60 s: not slow
    assert slow_requests(results, 60.0) == [crawled, failed_late]


def test_served_durations_are_the_served_requests_median_99th_percentile_and_longest():
    def served(seconds):
        return RequestResult(0, "grpc", "vote", 100.0, 100.0 + seconds, SERVED, "stop")

    results = [served(float(s)) for s in range(1, 101)] + [RequestResult(0, "grpc", "off", 0, 500, FAILED, "x")]
    assert duration_figures(results) == {"p50_s": 50.5, "p99_s": 99.01, "max_s": 100.0}  # numpy's interpolation
    assert duration_figures([]) == {"p50_s": None, "p99_s": None, "max_s": None}


def test_the_command_line_gives_every_setting_its_default_and_takes_a_slow_limit():
    assert parse_args([]) == Settings()
    assert parse_args(["--slow-s", "30", "--hang-s", "90"]) == Settings(slow_s=30.0, hang_s=90.0)
    with pytest.raises(SystemExit):
        parse_args(["--slow-s", "0"])


def test_a_covering_run_goes_on_until_every_fault_kind_and_every_protocol_and_mode_served():
    every_pair = list(itertools.product(PROTOCOLS, MODES))
    assert uncovered(["ssm_kill", "reload"], ["reload", "ssm_kill", "reload"], every_pair * 2) == []
    assert uncovered(["ssm_kill", "reload"], ["reload"], every_pair) == ["no ssm_kill fault"]
    (protocol, mode), *rest = every_pair
    assert uncovered(["reload"], ["reload"], rest) == [f"no {protocol} {mode} request served"]
    assert parse_args(["--cover", "--max-minutes", "9"]) == Settings(cover=True, max_minutes=9.0)


def test_requests_around_a_fault_are_those_under_way_at_it_and_those_sent_during_it():
    def req(start, end, outcome):
        return RequestResult(0, "grpc", "vote", start, end, outcome, "")

    results = [req(1, 5, SERVED),  # before the fault
               req(2, 130, HUNG),  # caught by an earlier fault that ended at 3
               req(8, 12, FAILED),  # under way at the fault (10)
               req(11, 12, REFUSED), req(14, 15, SERVED),  # sent while it lasted (to 20)
               req(25, 26, SERVED)]  # after
    assert window_outcomes(results, 10, 20, since=3) == {"in_flight": {FAILED: 1},
                                                         "sent_during": {REFUSED: 1, SERVED: 1}}


@pytest.mark.parametrize("deploy, stores", [("deploy.qwen.yaml", 2), ("deploy.torch.yaml", 2)])
def test_the_chaos_deployment_holds_every_prefix_store_to_the_leak_check_s_bound(tmp_path, deploy, stores):
    """The llama.cpp and torch engines (LLM and distilled SSMs) keep finished sequences' KV up to
    prefix_cache_ram_mib; the lookup drafters keep none."""
    from benchmarks.chaos.run import LEAK_CHECK_RAM_MIB, leak_check_deployment
    from minions.deploy.config import ROOT, load_deployment

    path = leak_check_deployment(str(ROOT / deploy), tmp_path / "chaos.yaml")
    dep = load_deployment(path)
    storing = [m for m in [dep.llm, *dep.ssms] if m["engine"] in ("llamacpp", "torch", "distilled")]
    assert len(storing) == stores and all(m["prefix_cache_ram_mib"] == LEAK_CHECK_RAM_MIB for m in storing)
    assert all("prefix_cache_ram_mib" not in m for m in dep.ssms if m not in storing)
    assert dep.cache_dir == load_deployment(ROOT / deploy).cache_dir
