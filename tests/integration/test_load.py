"""Full Minions under load through the real server: vote + adaptive length + pipeline, 8 streams at once.

Greedy output must equal `off` token for token while the LLM verifies several requests' drafts in one
batched pass; the engine's batch metrics show that batching really happened.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import NearTies, kept_prompts, metric_value

PROMPTS = kept_prompts("load")


def _run(server, prompt: str, **params):
    return generate_grpc(server.grpc_url, "minions", prompt, GenerationParams(max_tokens=32, chat=True, **params))


def test_full_minions_equals_off_under_8_concurrent_streams(torch_server):
    server = torch_server  # ssm_q4 batches drafts in flight
    plain = [_run(server, p, speculation="off") for p in PROMPTS]  # one at a time: nothing to batch with
    before = {m: _batch_totals(server, m) for m in ("llm", "ssm_q4")}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        full = list(pool.map(lambda p: _run(server, p, speculation="vote", pipeline=True), PROMPTS))
        off = list(pool.map(lambda p: _run(server, p, speculation="off"), PROMPTS))
    for i, (a, b, c) in enumerate(zip(plain, full, off)):
        assert (b.text, b.num_output_tokens) == (a.text, a.num_output_tokens), f"minions diverged on prompt {i}"
        assert (c.text, c.num_output_tokens) == (a.text, a.num_output_tokens), f"batched off diverged on prompt {i}"
        assert b.draft_lengths and len(b.draft_lengths) == b.num_llm_calls
        assert sum(b.draft_lengths) == b.total_draft_tokens
    llm, ssm = (_mean_batch(before[m], _batch_totals(server, m)) for m in ("llm", "ssm_q4"))
    assert llm > 1.2, "concurrent requests were verified together"
    assert ssm > 1.2, "concurrent requests were drafted together"


def test_one_stream_uses_early_drafts(torch_server):
    """At a load of one (pipeline_max_load) round r+1 is drafted while round r verifies."""
    server = torch_server
    prompt = PROMPTS[1]
    full = _run(server, prompt, speculation="vote", pipeline=True, num_draft_tokens=4, return_perf_metrics=True)
    assert full.num_pipelined_drafts > 0, "the pipeline produced drafts that were used"
    assert full.text == _run(server, prompt, speculation="off").text


def test_concurrent_streams_on_llama_cpp_equal_off_up_to_near_ties(speculating_server):
    """llama.cpp in-flight batching: 8 concurrent requests (plain streams and verifications) share decode
    steps. Each output is the one `off` gives alone, except where llama.cpp's batch-shape rounding flips
    a near tie: any divergence is printed with its logit gap and must be one."""
    server = speculating_server
    alone = [_run(server, p, speculation="off") for p in PROMPTS]
    before = _batch_totals(server, "llm")
    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
        runs = [pool.submit(_run, server, p, speculation=mode) for mode in ("off", "vote") for p in PROMPTS]
        together = [r.result() for r in runs]
    assert _mean_batch(before, _batch_totals(server, "llm")) > 1.2, "concurrent requests shared llama.cpp steps"
    ties = NearTies(server)
    for i, out in enumerate(together):
        j = i % len(PROMPTS)
        ties.assert_same_or_near_tie(PROMPTS[j], alone[j].text, out.text, f"prompt {j}")


def _batch_totals(server, model: str) -> tuple[float, float]:
    """(passes, sequences) the engine has run so far."""
    return tuple(metric_value(server.metrics_url, "minions_engine_batch_total", model=model, what=what)
                 for what in ("passes", "sequences"))


def _mean_batch(before: tuple[float, float], after: tuple[float, float]) -> float:
    return (after[1] - before[1]) / (after[0] - before[0])


def test_fixed_draft_length_and_pipeline_switch(torch_server):
    server = torch_server  # ssm_q4 always drafts the length asked for
    prompt = PROMPTS[0]
    fixed = _run(server, prompt, speculation="vote", num_draft_tokens=3, pipeline=False)
    # Round 1 is the prompt's prefill; the last draft is cut to the tokens left.
    assert fixed.draft_lengths[0] == 0 and set(fixed.draft_lengths[1:-1]) == {3} and fixed.draft_lengths[-1] <= 3
    assert fixed.num_pipelined_drafts == 0
    off = _run(server, prompt, speculation="off")
    assert fixed.text == off.text
