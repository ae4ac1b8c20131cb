"""A sweep of bad requests to `minions` over Triton's own endpoints: the gRPC stream, HTTP generate and
HTTP generate_stream. Each request ends with exactly one answer, an error that says what to change
(INVALID_ARG, HTTP 400), never an internal error (the orchestrator counts none as `error` and logs no
traceback) and never a hang (every call has a deadline); the server serves on after the sweep.

What Triton itself refuses before the model (wrong dtypes and shapes, a missing input, and on HTTP a
body its JSON parser cannot read, which Triton 2.51 answers with 500) is pinned as Triton's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from client.api import GenerationParams, generate_grpc
from minions.settings import DEFAULTS
from tests.integration.helpers import http_ok, metric_value
from tests.integration.triton_calls import Raw, grpc_stream, http_generate, json_body, tensors

NAN, INF = math.nan, math.inf
LONE = "\udc00"
"""A lone low surrogate: Triton's HTTP frontend passes JSON's escape of it on to the model as bytes."""
HI = {"text_input": "hi", "max_tokens": 4}

MODEL_REFUSES: dict[str, tuple[dict, str]] = {
    "empty text": ({"text_input": ""}, "'text_input' is empty"),
    "blank text": ({"text_input": " \n\t "}, "'text_input' is empty"),
    "text not UTF-8": ({"text_input": b"caf\xe9"}, "input 'text_input' is not valid UTF-8"),
    "lone surrogate in the text": ({"text_input": "a" + LONE}, "input 'text_input': a lone UTF-16 surrogate"),
    "lone surrogate in a chat message": ({"text_input": '[{"role": "user", "content": "\\ud800"}]', "chat": True},
                                         "chat message 0, 'content': a lone UTF-16 surrogate"),
    "lone surrogate in a stop string": ({**HI, "stop_words": ["ok", LONE]}, "input 'stop_words': a lone UTF-16"),
    "lone surrogate in a bad word": ({**HI, "bad_words": [LONE]}, "input 'bad_words': a lone UTF-16 surrogate"),
    "lone surrogate in speculation": ({**HI, "speculation": LONE}, "input 'speculation': a lone UTF-16"),
    "stop string not UTF-8": ({**HI, "stop_words": [b"\xff"]}, "input 'stop_words' is not valid UTF-8"),
    "max_tokens zero": ({"text_input": "hi", "max_tokens": 0}, "'max_tokens' must be in [1, 1024], got 0"),
    "max_tokens negative": ({"text_input": "hi", "max_tokens": -5}, "'max_tokens' must be in [1, 1024], got -5"),
    "max_tokens huge": ({"text_input": "hi", "max_tokens": 2**31 - 1}, "got 2147483647"),
    "temperature NaN": ({**HI, "temperature": NAN}, "'temperature' must be >= 0, got nan"),
    "temperature infinite": ({**HI, "temperature": INF}, "'temperature' must be >= 0, got inf"),
    "temperature negative": ({**HI, "temperature": -0.5}, "'temperature' must be >= 0"),
    "top_p NaN": ({**HI, "top_p": NAN}, "'top_p' must be in (0, 1], got nan"),
    "top_p infinite": ({**HI, "top_p": INF}, "'top_p' must be in (0, 1], got inf"),
    "top_p zero": ({**HI, "top_p": 0.0}, "'top_p' must be in (0, 1]"),
    "top_k negative": ({**HI, "top_k": -1}, "'top_k' must be >= 0, got -1"),
    "top_k most negative": ({**HI, "top_k": -(2**31)}, "'top_k' must be >= 0"),
    "repetition_penalty zero": ({**HI, "repetition_penalty": 0.0}, "'repetition_penalty' must be > 0"),
    "repetition_penalty NaN": ({**HI, "repetition_penalty": NAN}, "'repetition_penalty' must be > 0"),
    "presence_penalty infinite": ({**HI, "presence_penalty": INF}, "'presence_penalty' must be a finite number"),
    "frequency_penalty NaN": ({**HI, "frequency_penalty": NAN}, "'frequency_penalty' must be a finite number"),
    "min_tokens negative": ({**HI, "min_tokens": -1}, "'min_tokens' must be >= 0"),
    "num_draft_tokens negative": ({**HI, "num_draft_tokens": -1}, "'num_draft_tokens' must be in [0, 16]"),
    "num_draft_tokens above the limit": ({**HI, "num_draft_tokens": 99}, "'num_draft_tokens' must be in [0, 16]"),
    "unknown speculation": ({**HI, "speculation": "magic"}, "unknown speculation 'magic'"),
    "unknown SSM": ({**HI, "speculation": "single:ssm_nope"}, "unknown SSM 'ssm_nope'"),
    "empty speculation": ({**HI, "speculation": ""}, "unknown speculation ''"),
    "too many stop strings": ({**HI, "stop_words": [f"s{i}" for i in range(10_000)]},
                              f"at most {DEFAULTS.limits.stop_strings} stop strings (max_stop_strings), got 10000"),
    "a stop string too long": ({**HI, "stop_words": ["x" * 100_000]},
                               f"at most {DEFAULTS.limits.stop_chars} characters (max_stop_chars), got one of 100000"),
    "end_id negative": ({**HI, "end_id": -1}, "'end_id' must be a token id in [0, 49151], got -1"),
    "end_id beyond the vocabulary": ({**HI, "end_id": 10**9}, "got 1000000000"),
    "beam search": ({**HI, "beam_width": 2}, "beam search is not supported"),
    "several sequences": ({**HI, "num_return_sequences": 3}, "one sequence per request"),
    "generation logits": ({**HI, "return_generation_logits": True}, "generation logits are not returned"),
    "a LoRA adapter": ({**HI, "lora_task_id": 7}, "LoRA adapters are not supported"),
    "an image": ({**HI, "image_url_input": "http://example.com/cat.png"}, "image input are not supported"),
    "prompt longer than the context": ({"text_input": "word " * 3000}, "the context holds 2048"),
    "no chat messages": ({"text_input": "[]", "chat": True}, "empty list of messages"),
    "chat content null": ({"text_input": '[{"role": "user", "content": null}]', "chat": True},
                          "chat message 0 has content of type NoneType"),
    "chat role unknown": ({"text_input": '[{"role": "wizard", "content": "hi"}]', "chat": True}, "role 'wizard'"),
    "two prompts in one request": ({"text_input": Raw(np.array([[b"a"], [b"b"]], dtype=np.object_), "BYTES")},
                                   "input 'text_input' must hold one value, got shape [2, 1]"),
    "no text_input": ({"max_tokens": 4}, "input 'text_input' is required"),
}
"""Refused by the orchestrator (serving/request.py and friends): INVALID_ARG with its message. Over HTTP
only the cases JSON can carry (no raw bytes, no raw tensors)."""

TRITON_REFUSES_GRPC: dict[str, tuple[dict, str]] = {
    "max_tokens as FP32": ({"text_input": "hi", "max_tokens": Raw(np.array([[8.0]], np.float32), "FP32")},
                           "data-type is 'FP32', but model 'minions' expects 'INT32'"),
    "temperature as FP64": ({"text_input": "hi", "temperature": Raw(np.array([[0.5]], np.float64), "FP64")},
                            "data-type is 'FP64', but model 'minions' expects 'FP32'"),
    "text_input as INT32": ({"text_input": Raw(np.array([[1]], np.int32), "INT32")},
                            "data-type is 'INT32', but model 'minions' expects 'BYTES'"),
    "two values in one row": ({"text_input": Raw(np.array([[b"a", b"b"]], dtype=np.object_), "BYTES")},
                              "unexpected shape for input 'text_input'"),
    "max_tokens of two values": ({"text_input": "hi", "max_tokens": Raw(np.array([[4, 4]], np.int32), "INT32")},
                                 "unexpected shape for input 'max_tokens'"),
    "stop_words in three dimensions": ({**HI, "stop_words": Raw(np.array([[[b"a"]]], dtype=np.object_), "BYTES")},
                                       "unexpected shape for input 'stop_words'"),
    "a batch of none": ({"text_input": Raw(np.zeros((0, 1), dtype=np.object_), "BYTES")}, "got 0"),
    "batch sizes that differ": ({"text_input": Raw(np.array([[b"a"], [b"b"]], dtype=np.object_), "BYTES"),
                                 "max_tokens": 4}, "batch size does not match other inputs"),
    "an input the model does not declare": ({**HI, "prompt": Raw(np.array([[b"hi"]], dtype=np.object_), "BYTES")},
                                            "unexpected inference input 'prompt'"),
}
"""Refused by Triton before the model: one error on the stream, with Triton's message."""

TRITON_REFUSES_HTTP: dict[str, tuple[str, str]] = {
    "no inputs": ("{}", "expected number of inputs between 1 and"),
    "an empty stop list in a list": ('{"text_input": "hi", "stop_words": [[]]}', "expected 1 string elements"),
    "two prompts": ('{"text_input": ["a", "b"], "max_tokens": 4}', "batch size does not match other inputs"),
}
"""Refused by Triton before the model with 400 (INVALID_ARG)."""

TRITON_JSON_500: dict[str, tuple[str, str]] = {
    "not JSON": ("not json", "failed to parse the request JSON buffer"),
    "a lone high surrogate": ('{"text_input": "\\ud800"}', "The surrogate pair in string is invalid"),
    "a number beyond a double": ('{"text_input": "hi", "temperature": 1e999}', "Number too big to be stored"),
    "max_tokens as a string": ('{"text_input": "hi", "max_tokens": "ten"}', "Unable to parse 'data'"),
    "max_tokens fractional": ('{"text_input": "hi", "max_tokens": 2.5}', "Unable to parse 'data'"),
    "max_tokens a bool": ('{"text_input": "hi", "max_tokens": true}', "Unable to parse 'data'"),
    "seed negative": ('{"text_input": "hi", "seed": -1}', "Unable to parse 'data'"),
    "text_input a number": ('{"text_input": 5}', "Unable to parse JSON bytes array"),
}
"""Bodies Triton 2.51's HTTP frontend cannot convert to tensors: it answers 500 itself (its JSON parser's
errors are INTERNAL), before the model; the message says what is wrong. Pinned as Triton's behaviour
(docs/api.md); a lone high surrogate never reaches the model over HTTP, a lone low one does (above)."""


def _state(server) -> tuple[float, int]:
    """(requests the orchestrator counted `error`, tracebacks in the server's log), once a good request
    has been served: the orchestrator exports its counts before a request's final response, so the
    counts then include every request answered before it."""
    ok = generate_grpc(server.grpc_url, "minions", "Say hi.", GenerationParams(max_tokens=4, chat=True))
    assert ok.num_output_tokens > 0 and ok.text, "the server serves a good request"
    return metric_value(server.metrics_url, "minions_requests", outcome="error"), server.log_text().count("Traceback")


def _after_the_sweep(server, before: tuple[float, int], problems: list[str]) -> None:
    assert not problems, "\n".join(problems)
    assert http_ok(f"{server.http_url}/v2/health/ready"), "the server is ready after the sweep"
    errors, tracebacks = _state(server)
    assert errors == before[0], f"the orchestrator counted {errors - before[0]:.0f} requests as internal errors"
    assert tracebacks == before[1], f"the server logged a traceback:\n{server.log_text()[-4000:]}"


def _one_error(answer, message: str) -> str | None:
    """What is wrong with a gRPC stream's answers to a request that must be refused (None: nothing)."""
    if answer.results or len(answer.errors) != 1:
        return f"{len(answer.results)} results and errors {[str(e) for e in answer.errors]}, not one error"
    if message not in str(answer.errors[0]):
        return f"error {str(answer.errors[0])!r} does not say {message!r}"
    return None


def test_the_grpc_stream_answers_each_bad_request_with_one_clear_error(server):
    before = _state(server)
    problems = []
    for name, (inputs, message) in {**MODEL_REFUSES, **TRITON_REFUSES_GRPC}.items():
        if problem := _one_error(grpc_stream(server.grpc_url, tensors(inputs)), message):
            problems.append(f"{name}: {problem}")
    _after_the_sweep(server, before, problems)


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "generate_stream"])
def test_http_answers_each_bad_request_with_a_400_and_one_clear_error(server, stream):
    before = _state(server)
    problems = []
    bodies = {name: (json_body(inputs), message) for name, (inputs, message) in MODEL_REFUSES.items()}
    for name, (body, message) in {**bodies, **TRITON_REFUSES_HTTP}.items():
        if body is None:
            continue
        status, answers = http_generate(server.http_url, body, stream)
        if status != 400 or len(answers) != 1 or message not in answers[0].get("error", ""):
            problems.append(f"{name}: {status} {answers}, not 400 with one error saying {message!r}")
    _after_the_sweep(server, before, problems)


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "generate_stream"])
def test_a_body_tritons_http_frontend_cannot_read_is_its_own_500(server, stream):
    """Pinned: Triton's answer, not the model's (the model never sees these requests)."""
    before = _state(server)
    problems = []
    for name, (body, message) in TRITON_JSON_500.items():
        status, answers = http_generate(server.http_url, body, stream)
        if status != 500 or len(answers) != 1 or message not in answers[0].get("error", ""):
            problems.append(f"{name}: {status} {answers}, not Triton's 500 saying {message!r}")
    _after_the_sweep(server, before, problems)
