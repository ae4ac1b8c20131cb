"""`vote` and `bandit` through the real server, over gRPC and HTTP, with their per-SSM metrics."""

from __future__ import annotations

import pytest

from client.api import GenerationParams, generate_grpc, generate_http
from tests.integration.helpers import COPY_PROMPT, metric_above, metric_value


@pytest.mark.parametrize("mode", ["vote", "bandit", "vote:ssm_suffix,ssm_ngram"])
@pytest.mark.parametrize("stream", [False, True])
def test_http_vote_and_bandit_equal_plain_greedy(server, mode, stream):
    """A fixed draft length: every round drafts. An adaptive one may leave a copy unverified where what
    the server has learnt by then prices its drafts out (a CI run: bandit, streamed, nothing drafted)."""
    params = {"max_tokens": 32, "chat": True}
    plain = generate_http(server.http_url, "minions", COPY_PROMPT, GenerationParams(speculation="off", **params),
                          stream=stream)
    spec = generate_http(server.http_url, "minions", COPY_PROMPT,
                         GenerationParams(speculation=mode, num_draft_tokens=4, return_perf_metrics=True, **params),
                         stream=stream)
    assert (spec.text, spec.num_output_tokens) == (plain.text, plain.num_output_tokens)
    assert spec.total_draft_tokens > 0 and spec.num_rounds < plain.num_output_tokens


def test_vote_exports_per_ssm_metrics(server):
    """Which SSMs draft depends on the weights learnt so far (a dominant one drafts mostly alone),
    so this checks that drafting is counted and that every SSM's weight is exported."""
    ssms = ("ssm_suffix", "ssm_ngram")
    before = sum(metric_value(server.metrics_url, "minions_ssm_drafts", ssm=s) for s in ssms)
    generate_grpc(server.grpc_url, "minions", COPY_PROMPT,
                  GenerationParams(max_tokens=48, chat=True, speculation="vote"))
    assert sum(metric_value(server.metrics_url, "minions_ssm_drafts", ssm=s) for s in ssms) > before
    for ssm in ssms:
        assert metric_above(server.metrics_url, "minions_ssm_weight", ssm=ssm) > 0
        drafted = metric_value(server.metrics_url, "minions_ssm_draft_tokens", ssm=ssm)
        assert 0 <= metric_value(server.metrics_url, "minions_ssm_matched_tokens", ssm=ssm) <= drafted
    assert metric_value(server.metrics_url, "minions_ssm_chosen") > 0
    assert metric_value(server.metrics_url, "minions_control_seconds", speculation="vote") > 0
    assert metric_above(server.metrics_url, "minions_request_seconds", speculation="vote") > 0


@pytest.mark.parametrize("mode", ["vote", "bandit"])
def test_sampled_vote_and_bandit_work(server, mode):
    """Sampled requests succeed. Their outputs follow the LLM's distribution (the chi-square tests in
    tests/unit), but are not reproducible by seed alone: which SSM drafts depends on what the shared
    policy has learnt by then, and the accept/resample draws depend on the draft (docs/api.md, `seed`).
    What is reproducible whatever the drafts and the seed: a sampled request whose distribution at
    every step is the LLM's top token alone (top_p below any token's probability) decodes exactly
    the greedy output, through the sampled path (SSMs' sampled drafts, accept/resample draws)."""
    params = GenerationParams(max_tokens=24, chat=True, temperature=0.8, top_p=0.95, seed=77, speculation=mode,
                              return_perf_metrics=True)
    out = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, params)
    # A sampled end-of-sequence token may end the line early (plain `off` sampling does so for some seeds too).
    assert (out.finish_reason, out.num_output_tokens == 24) in {("length", True), ("stop", False)}
    assert out.text

    greedy = generate_grpc(server.grpc_url, "minions", COPY_PROMPT,
                           GenerationParams(max_tokens=24, chat=True, speculation="off"))
    for seed in (77, 78):
        # A fixed draft length: every round drafts (an adaptive one may settle on plain decoding).
        top_only = generate_grpc(server.grpc_url, "minions", COPY_PROMPT, GenerationParams(
            max_tokens=24, chat=True, temperature=0.8, top_p=1e-6, seed=seed, speculation=mode, num_draft_tokens=4,
            return_perf_metrics=True))
        assert (top_only.text, top_only.num_output_tokens) == (greedy.text, greedy.num_output_tokens), f"seed {seed}"
        assert top_only.total_draft_tokens > 0 and top_only.num_rounds < top_only.num_output_tokens, \
            f"seed {seed}: the copied code was drafted and accepted"
