"""`vote` and `bandit` through the real server, over gRPC and HTTP, with their per-SSM metrics."""

from __future__ import annotations

import pytest

from client.api import GenerationParams, generate_grpc, generate_http
from tests.integration.helpers import metric_value

PROMPT = "List three uses of a paperclip."


@pytest.mark.parametrize("mode", ["vote", "bandit", "vote:ssm_q4,ssm_ngram"])
@pytest.mark.parametrize("stream", [False, True])
def test_http_vote_and_bandit_equal_plain_greedy(server, mode, stream):
    params = {"max_tokens": 32, "chat": True}
    plain = generate_http(server.http_url, "minions", PROMPT, GenerationParams(speculation="off", **params), stream=stream)
    spec = generate_http(server.http_url, "minions", PROMPT,
                         GenerationParams(speculation=mode, return_perf_metrics=True, **params), stream=stream)
    assert (spec.text, spec.num_output_tokens) == (plain.text, plain.num_output_tokens)
    assert spec.total_draft_tokens > 0 and spec.num_verifications < plain.num_output_tokens


def test_vote_exports_per_ssm_metrics(server):
    before = {s: metric_value(server.metrics_url, "minions_ssm_drafts", ssm=s) for s in ("ssm_q4", "ssm_ngram")}
    generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(max_tokens=48, chat=True, speculation="vote"))
    after = {s: metric_value(server.metrics_url, "minions_ssm_drafts", ssm=s) for s in ("ssm_q4", "ssm_ngram")}
    assert all(after[s] > before[s] for s in after), "every SSM drafts in (at least the first) voted rounds"
    for ssm in ("ssm_q4", "ssm_ngram"):
        assert metric_value(server.metrics_url, "minions_ssm_weight", ssm=ssm) > 0
        drafted = metric_value(server.metrics_url, "minions_ssm_draft_tokens", ssm=ssm)
        assert 0 <= metric_value(server.metrics_url, "minions_ssm_matched_tokens", ssm=ssm) <= drafted
    assert metric_value(server.metrics_url, "minions_ssm_chosen") > 0
    assert metric_value(server.metrics_url, "minions_control_seconds", speculation="vote") > 0
    assert metric_value(server.metrics_url, "minions_request_seconds", speculation="vote") > 0


@pytest.mark.parametrize("mode", ["vote", "bandit"])
def test_sampled_vote_and_bandit_reproduce_with_a_seed(server, mode):
    params = GenerationParams(max_tokens=24, chat=True, temperature=0.8, top_p=0.95, seed=77, speculation=mode)
    a = generate_grpc(server.grpc_url, "minions", "Write a line of poetry.", params)
    b = generate_grpc(server.grpc_url, "minions", "Write a line of poetry.", params)
    assert a.num_output_tokens > 0 and a.text == b.text
