"""End to end through the real tritonserver: gRPC streaming, HTTP generate / generate_stream, metrics."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from client.__main__ import main as cli_main
from client.api import GenerationParams, generate_grpc, generate_http
from minions.speculation.watch import PROBE_OUTCOMES
from tests.integration.helpers import COPY_PROMPT, NearTies, http_post, metric_above, metric_value

PROMPT = "Name three primary colors."


def test_grpc_stream_yields_chunks_that_add_up_to_the_non_streamed_text(server):
    """A fixed draft length, so that every round drafts: an adaptive one follows what the session's
    server has learnt from the tests before, and a CI run priced this copy's drafts out (none made)."""
    params = GenerationParams(max_tokens=40, chat=True, speculation="single:ssm_suffix", num_draft_tokens=4)
    streamed = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, params, stream=True)
    whole = generate_http(server.http_url, "minions", COPY_PROMPT, params, stream=False)
    assert len(streamed.chunks) > 1
    assert streamed.text == whole.text
    assert streamed.num_output_tokens == whole.num_output_tokens > 0
    assert streamed.finish_reason in ("stop", "length")
    assert streamed.total_draft_tokens and streamed.total_draft_tokens >= streamed.total_accepted_draft_tokens > 0
    assert 0.0 < streamed.acceptance_rate <= 1.0


def test_http_generate_returns_exactly_one_json_response_with_the_prompt(server):
    status, body = http_post(f"{server.http_url}/v2/models/minions/generate",
                             {"text_input": PROMPT, "max_tokens": 12, "chat": True, "speculation": "single:ssm_suffix"})
    assert status == 200, body
    payload = json.loads(body)  # one JSON object: a second response would break the generate endpoint
    assert payload["text_output"].startswith(PROMPT), "exclude_input_in_output defaults to false, as in tensorrt_llm_bls"
    assert len(payload["text_output"]) > len(PROMPT)
    assert payload["num_output_tokens"] == 12 or payload["finish_reason"] == "stop"


def test_http_generate_stream_sends_sse_events_and_a_final_one(server):
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/minions/generate_stream",
        data=json.dumps({"text_input": PROMPT, "max_tokens": 16, "stream": True, "chat": True,
                         "exclude_input_in_output": True}).encode(),
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        events = [json.loads(line[5:]) for line in resp.read().decode().splitlines() if line.startswith("data:")]
    assert len(events) > 1
    assert all("error" not in e for e in events)
    assert "finish_reason" in events[-1] and all("finish_reason" not in e for e in events[:-1])
    assert events[-1]["num_output_tokens"] <= 16


def test_stop_words_end_the_text_before_the_stop_string(server):
    prompt = "Describe the ocean in two sentences."
    full = generate_grpc(server.grpc_url, "minions", prompt, GenerationParams(max_tokens=40, chat=True))
    words = re.findall(r"[A-Za-z]{4,}", full.text)
    assert len(words) > 3, full.text
    stop = words[3]
    cut = generate_grpc(server.grpc_url, "minions", prompt,
                        GenerationParams(max_tokens=40, chat=True, stop_words=[stop, "zzzz-never"]))
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason == "stop"


def test_seeded_sampling_is_reproducible(server):
    params = GenerationParams(max_tokens=24, chat=True, temperature=0.9, top_p=0.95, seed=1234, speculation="single:ssm_ngram",
                              num_draft_tokens=4, pipeline=False)
    a = generate_grpc(server.grpc_url, "minions", "Write a line of poetry.", params)
    b = generate_grpc(server.grpc_url, "minions", "Write a line of poetry.", params)
    assert a.text == b.text and a.num_output_tokens > 0


def test_concurrent_streams_match_sequential_outputs(server):
    """Each request runs in its own task in the BLS; concurrency must not mix up sequences or caches.
    llama.cpp computes a shared step with other kernels than a lone one, so an output may leave the
    sequential one only at a printed near tie ("What is rain?" does, at a gap of 0.005)."""
    prompts = ["What is rain?", "Give me a synonym for happy.", "What is 2 + 2?", "Describe a cat."]
    modes = ["vote", "off", "bandit", "single:ssm_suffix"]

    def run(args):
        prompt, mode = args
        return generate_grpc(server.grpc_url, "minions", prompt,
                             GenerationParams(max_tokens=20, chat=True, speculation=mode)).text

    sequential = [run(a) for a in zip(prompts, modes)]
    with ThreadPoolExecutor(4) as pool:
        concurrent = list(pool.map(run, zip(prompts, modes)))
    ties = NearTies(server)
    for prompt, mode, alone, together in zip(prompts, modes, sequential, concurrent, strict=True):
        ties.assert_same_or_near_tie(prompt, alone, together, f"{mode} on {prompt!r}")


def test_metrics_count_drafts_and_accepted_tokens_per_ssm(torch_server):
    server = torch_server  # ssm_q4 drafts on every prompt
    generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(max_tokens=24, chat=True, speculation="single:ssm_q4"))

    def value(name: str, **labels: str) -> float:
        return metric_value(server.metrics_url, name, **labels)

    drafted = value("minions_spec_decode_num_draft_tokens", ssm="ssm_q4")
    accepted = value("minions_spec_decode_num_accepted_tokens", ssm="ssm_q4")
    assert drafted > 0 and 0 < accepted <= drafted
    assert value("minions_spec_decode_num_accepted_tokens_per_pos", ssm="ssm_q4", position="0") > 0
    assert metric_above(server.metrics_url, "minions_requests", outcome="success") >= 1


def test_metrics_count_the_probes_of_a_plain_stream(server):
    """A `vote` request on chat decodes mostly plainly, streamed while its lookup drafters are probed
    now and then (watch.py): each probe is counted by how it ended."""
    before = metric_value(server.metrics_url, "minions_probes")
    generate_grpc(server.grpc_url, "minions", "Write a short story about a lighthouse keeper and a storm.",
                  GenerationParams(max_tokens=64, chat=True, speculation="vote"))
    assert metric_above(server.metrics_url, "minions_probes", before) > before
    outcomes = {o: metric_value(server.metrics_url, "minions_probes", outcome=o) for o in PROBE_OUTCOMES}
    assert sum(outcomes.values()) == metric_value(server.metrics_url, "minions_probes"), outcomes


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_client_cli_streams_text(server, protocol, capsys):
    from client.__main__ import main

    url = server.grpc_url if protocol == "grpc" else server.http_url
    assert main([PROMPT, "--protocol", protocol, "--url", url, "--max-tokens", "8", "--timing"]) == 0
    out = capsys.readouterr()
    assert out.out.strip()
    assert "tok/s" in out.err and "TTFT" in out.err


def test_a_short_request_is_not_queued_behind_a_long_one(server):
    """One BLS instance serves many requests at once: each runs in its own task, interleaving rounds."""
    import threading

    started = threading.Event()
    finished: list[str] = []
    """Which request ended first (appends are atomic): an order, not clock readings."""

    def long_request():
        generate_grpc(server.grpc_url, "minions", "Write a long essay about the sea.",
                      GenerationParams(max_tokens=160, chat=True, speculation="off"),
                      on_text=lambda _: started.set())
        finished.append("long")

    worker = threading.Thread(target=long_request)
    worker.start()
    assert started.wait(60)
    short = generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=3, chat=True, speculation="off"))
    finished.append("short")
    worker.join(120)
    assert short.num_output_tokens > 0
    assert finished == ["short", "long"], "the short request waited for the long one to finish"


@pytest.mark.parametrize("ssm", ["ssm_q4", "ssm_ngram"])
def test_sampled_drafts_with_draft_logits_work_and_reproduce(torch_server, ssm):
    """use_draft_logits: ssm_q4 samples its draft and sends logits (min(1, p/q) rule); ssm_ngram has none
    and is judged as deterministic. Neither may count as an SSM failure."""
    server = torch_server
    # A seed reproduces the output for a fixed draft length without the pipeline: the adaptive length
    # and the early drafts depend on measured timings (docs/api.md, `seed`).
    params = GenerationParams(max_tokens=32, chat=True, temperature=0.8, top_p=0.95, seed=7,
                              speculation=f"single:{ssm}", use_draft_logits=True, num_draft_tokens=4, pipeline=False)
    # counted around these requests only: earlier `vote` requests may have seen an SSM miss its deadline
    failures_before = metric_value(server.metrics_url, "minions_ssm_failures", ssm=ssm)
    a = generate_grpc(server.grpc_url, "minions", "Write a line of poetry about rivers.", params)
    b = generate_grpc(server.grpc_url, "minions", "Write a line of poetry about rivers.", params)
    assert a.text == b.text and a.num_output_tokens > 0
    if ssm == "ssm_q4":
        assert a.total_draft_tokens > 0 and a.total_accepted_draft_tokens > 0
    assert metric_value(server.metrics_url, "minions_ssm_failures", ssm=ssm) == failures_before


def test_latency_histograms_count_each_request_once(server):
    """vLLM's TTFT, time-per-output-token and end-to-end histograms, per speculation mode."""
    names = ("minions_time_to_first_token_seconds", "minions_time_per_output_token_seconds",
             "minions_e2e_request_latency_seconds")
    before = {n: metric_value(server.metrics_url, f"{n}_count", speculation="off") for n in names}
    done = generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(max_tokens=16, chat=True, speculation="off"))
    for n in names:
        assert metric_above(server.metrics_url, f"{n}_count", before[n], speculation="off") == before[n] + 1
        assert metric_value(server.metrics_url, f"{n}_bucket", speculation="off", le="+Inf") == before[n] + 1
    ttft = metric_value(server.metrics_url, "minions_time_to_first_token_seconds_sum", speculation="off")
    e2e = metric_value(server.metrics_url, "minions_e2e_request_latency_seconds_sum", speculation="off")
    assert 0 < ttft < e2e and done.num_output_tokens > 1


def test_the_cli_streams_a_penalised_answer_and_reports_its_timing(server, capsys):
    code = cli_main(["Name three colours.", "--url", server.grpc_url, "--max-tokens", "12", "--temperature", "0",
                 "--min-tokens", "12", "--repetition-penalty", "1.2", "--speculation", "off", "--timing"])
    out = capsys.readouterr()
    assert code == 0 and out.out.strip(), out
    assert " cached), 12 tokens in" in out.err and "finish length" in out.err, out.err
