"""The LLM's prefix cache on the real server, with either engine: a re-sent prompt, or a
conversation's next turn, is not prefilled again (engines/prefix_cache.py, engines/torch_engine.py),
and vLLM's prefix-cache counters, the perf outputs and an OpenAI answer's usage say so."""

from __future__ import annotations

import dataclasses
import uuid

import openai
import pytest

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import kept_prompts, metric_above, metric_value

OFF = GenerationParams(max_tokens=4, speculation="off", return_perf_metrics=True)


FRESH_TAG_TOKENS = 8
"""A fresh prompt's random tag is longer: no earlier prompt shares more tokens with it than that."""


def long_prompt() -> str:
    """About 800 tokens no earlier request began with (a fresh tag first), ending with a whole question:
    an answer that went on with a cut word would take the prompt's last token into its own at the join."""
    text = "\n\n".join(kept_prompts("greedy_equality"))
    while len(text) < 3600:
        text += "\n\n" + text
    whole = text[: text.rfind("\n", 0, 3400)]
    return f"[{uuid.uuid4().hex}] Summarise these questions in one line.\n\n{whole}"


@pytest.fixture(params=["server", "torch_server"])
def any_server(request):
    """Either LLM engine: llama.cpp (deploy.yaml) or torch (deploy.torch.yaml)."""
    return request.getfixturevalue(request.param)


def test_a_repeated_prompt_skips_its_prefill_and_the_counters_count_it(any_server):
    server = any_server
    prompt = long_prompt()
    queries, hits = (metric_value(server.metrics_url, f"minions_prefix_cache_{what}", model="llm")
                     for what in ("queries", "hits"))
    first = generate_grpc(server.grpc_url, "minions", prompt, OFF)
    second = generate_grpc(server.grpc_url, "minions", prompt, OFF)
    assert second.text == first.text
    assert first.num_input_tokens > 600
    print(f"TTFT of a {first.num_input_tokens}-token prompt: {first.ttft_s:.3f} s, repeated {second.ttft_s:.3f} s")
    assert (first.kv_cache_reused_blocks, second.kv_cache_reused_blocks) == (0, (first.num_input_tokens - 1) // 128), \
        "the repeated prompt was prefilled again (minions reports the blocks of 128 tokens the LLM found cached)"
    assert first.num_cached_tokens < FRESH_TAG_TOKENS, "a fresh prompt shares at most its opening with others"
    assert second.num_cached_tokens == first.num_input_tokens - 1, \
        "every token of the prompt but the last (evaluated for its logits)"
    drafting = generate_grpc(server.grpc_url, "minions", prompt, dataclasses.replace(OFF, speculation="vote"))
    assert drafting.text == first.text
    assert drafting.kv_cache_reused_blocks == second.kv_cache_reused_blocks, \
        "reported by a drafting request too (its first call a stream, as `off`'s)"
    # The second request found all of its prompt but the last token (evaluated for its logits).
    assert metric_above(server.metrics_url, "minions_prefix_cache_hits", hits + first.num_input_tokens - 2,
                        model="llm") >= hits + first.num_input_tokens - 1
    assert metric_value(server.metrics_url, "minions_prefix_cache_queries", model="llm") >= \
        queries + 2 * first.num_input_tokens


def test_a_conversation_s_next_turn_reuses_the_first_turn_and_its_answer(any_server):
    server = any_server
    turn1 = long_prompt()
    answer = generate_grpc(server.grpc_url, "minions", turn1, OFF)
    hits = metric_value(server.metrics_url, "minions_prefix_cache_hits", model="llm")
    turn2 = generate_grpc(server.grpc_url, "minions", turn1 + answer.text + "\n\nAnd in French?", OFF)
    assert turn2.num_input_tokens > answer.num_input_tokens + 4
    # The whole first turn and most of its answer (detokenised and tokenised again, the answer's
    # tokens may split differently at the join) were cached.
    assert metric_above(server.metrics_url, "minions_prefix_cache_hits", hits + answer.num_input_tokens - 1,
                        model="llm") >= hits + answer.num_input_tokens


def test_an_openai_answer_s_usage_counts_the_prompt_tokens_found_cached(openai_url):
    """usage.prompt_tokens_details.cached_tokens, as OpenAI, vLLM and llama-server report it: 0 for a
    fresh prompt (but for an opening other prompts share), all but its last token when sent again, in a
    non-streamed answer and in a stream's usage."""
    api = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=120)
    prompt = long_prompt()
    ask = dict(model="minions", prompt=prompt, max_tokens=2, temperature=0, extra_body={"speculation": "off"})
    fresh = api.completions.create(**ask).usage
    again = [c.usage for c in api.completions.create(**ask, stream=True, stream_options={"include_usage": True})
             if c.usage is not None]
    assert fresh.prompt_tokens > 600 and fresh.prompt_tokens_details.cached_tokens < FRESH_TAG_TOKENS
    assert len(again) == 1 and again[0].prompt_tokens_details.cached_tokens == fresh.prompt_tokens - 1
