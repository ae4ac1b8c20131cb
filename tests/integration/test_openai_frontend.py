"""The OpenAI-compatible frontend, driven by the real `openai` client: chat completions and completions,
streamed and not, with usage; greedy answers equal `off` over Triton's own gRPC; a client that leaves
cancels its request in the model; errors are OpenAI's."""

from __future__ import annotations

import json

import openai
import pytest

from client.api import GenerationParams, generate_grpc, generate_openai
from tests.integration.helpers import COPY_PROMPT, metric_value, wait_until

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def api(openai_url):
    return openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=120)


def _off(server, prompt: str, max_tokens: int, chat: bool):
    return generate_grpc(server.grpc_url, "minions", prompt,
                         GenerationParams(max_tokens=max_tokens, speculation="off", chat=chat, temperature=0.0))


def test_models_lists_the_orchestrator(api):
    assert [m.id for m in api.models.list().data] == ["minions"]


def test_a_streamed_chat_completion_with_usage_equals_off(server, api):
    off = _off(server, json.dumps(CHAT), 32, chat=True)
    stream = api.chat.completions.create(model="minions", messages=CHAT, max_tokens=32, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"speculation": "vote"})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert text == off.text and finish == [off.finish_reason]
    assert usage.completion_tokens == off.num_output_tokens and usage.prompt_tokens > 10
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_the_client_librarys_openai_call_reads_what_the_openai_client_reads(server, openai_url):
    """client.api.generate_openai (what the Locust OpenAI user and llama-server comparisons send):
    the text, finish reason and token count of `off` over gRPC, with a TTFT."""
    off = _off(server, json.dumps(CHAT), 24, chat=True)
    got = generate_openai(openai_url, "minions", CHAT[0]["content"],
                          GenerationParams(max_tokens=24, temperature=0.0, speculation="vote"))
    assert (got.text, got.finish_reason, got.num_output_tokens) == (off.text, off.finish_reason, off.num_output_tokens)
    assert 0 < got.ttft_s <= got.latency_s and got.num_input_tokens > 10


@pytest.mark.parametrize("speculation", ["vote", "single:ssm_suffix"])
def test_a_completion_equals_off_streamed_or_not(server, api, speculation):
    off = _off(server, COPY_PROMPT, 40, chat=False)
    whole = api.completions.create(model="minions", prompt=COPY_PROMPT, max_tokens=40, temperature=0,
                                   extra_body={"speculation": speculation})
    assert whole.choices[0].text == off.text and whole.choices[0].finish_reason == off.finish_reason
    assert whole.usage.completion_tokens == off.num_output_tokens and whole.usage.prompt_tokens > 20
    chunks = list(api.completions.create(model="minions", prompt=COPY_PROMPT, max_tokens=40, temperature=0,
                                         stream=True, stream_options={"include_usage": True},
                                         extra_body={"speculation": speculation}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == off.text
    assert chunks[-1].usage.completion_tokens == off.num_output_tokens


def test_chat_max_completion_tokens_and_stop(api):
    """(`seed` reaching the model is a unit test: a repeated seeded request can differ here when the
    llama.cpp engine's float rounding differs, docs/api.md.)"""
    short = api.chat.completions.create(model="minions", messages=CHAT, max_completion_tokens=3, temperature=0)
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"
    # The stop string: a word of the model's own answer (whatever the model's weights make it), cut there.
    whole = api.completions.create(model="minions", prompt=COPY_PROMPT, max_tokens=60, temperature=0).choices[0].text
    word = next(w for w in whole.split()[len(whole.split()) // 2:] if len(w) >= 3)
    stopped = api.completions.create(model="minions", prompt=COPY_PROMPT, max_tokens=60, temperature=0, stop=[word])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == whole[: whole.index(word)]


def test_penalties_and_min_tokens_keep_speculation_exact(api):
    """OpenAI's penalties and the min_tokens / repetition_penalty extensions: every mode gives the
    same text, which the penalties change; min_tokens holds off the end of the text."""
    def complete(speculation: str, penalised: bool) -> str:
        penalties = {"presence_penalty": 0.6, "frequency_penalty": 0.4} if penalised else {}
        extension = {"repetition_penalty": 1.2} if penalised else {}
        answer = api.completions.create(model="minions", prompt=COPY_PROMPT, max_tokens=40, temperature=0,
                                        **penalties, extra_body={"speculation": speculation, "min_tokens": 40,
                                                                 **extension})
        assert answer.usage.completion_tokens == 40
        return answer.choices[0].text

    texts = {mode: complete(mode, penalised=True) for mode in ("off", "vote", "single:ssm_suffix")}
    assert len(set(texts.values())) == 1, texts
    assert texts["off"] != complete("off", penalised=False)


def test_logprobs_are_each_tokens_the_same_under_speculation(api):
    """logprobs: each generated token with the LLM's log probability, streamed or not, whatever the mode."""
    answers = {mode: api.completions.create(model="minions", prompt=COPY_PROMPT, max_tokens=16, temperature=0,
                                            logprobs=0, extra_body={"speculation": mode})
               for mode in ("off", "vote")}
    off = answers["off"].choices[0]
    assert "".join(off.logprobs.tokens) == off.text and len(off.logprobs.tokens) == 16
    assert all(lp <= 0 for lp in off.logprobs.token_logprobs)
    vote = answers["vote"].choices[0]
    assert vote.logprobs.tokens == off.logprobs.tokens
    assert vote.logprobs.token_logprobs == pytest.approx(off.logprobs.token_logprobs, abs=1e-2)
    chunks = list(api.chat.completions.create(model="minions", messages=CHAT, max_tokens=8, temperature=0,
                                              logprobs=True, stream=True))
    streamed = [c.token for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]
    whole = api.chat.completions.create(model="minions", messages=CHAT, max_tokens=8, temperature=0, logprobs=True)
    assert streamed == [c.token for c in whole.choices[0].logprobs.content] and len(streamed) == 8


def test_a_client_that_leaves_a_stream_cancels_its_request(server, api):
    cancelled = metric_value(server.metrics_url, "minions_requests", outcome="cancelled")
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    stream = api.chat.completions.create(model="minions", max_tokens=600, temperature=0, stream=True, messages=story)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    wait_until(lambda: metric_value(server.metrics_url, "minions_requests", outcome="cancelled") > cancelled,
               timeout=30, what="the request counted cancelled")
    wait_until(lambda: metric_value(server.metrics_url, "minions_engine_cached_sequences", model="llm") == 0,
               timeout=30, what="the LLM caches nothing")


def test_errors_are_openai_errors(api):
    with pytest.raises(openai.BadRequestError) as frontend_refusal:
        api.chat.completions.create(model="minions", messages=CHAT, n=2)
    body = frontend_refusal.value.body
    assert body["type"] == "invalid_request_error" and "n 1" in body["message"]
    with pytest.raises(openai.BadRequestError) as model_refusal:  # refused by the minions model, over gRPC
        api.completions.create(model="minions", prompt="Hi", extra_body={"speculation": "bogus"})
    assert "speculation" in model_refusal.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        api.completions.create(model="minions", prompt="Hi", temperature=-1)
    with pytest.raises(openai.NotFoundError) as unknown:
        api.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):  # refused before the stream starts: a status, not a broken stream
        api.chat.completions.create(model="minions", messages=[{"role": "wizard", "content": "Hi"}], stream=True)
