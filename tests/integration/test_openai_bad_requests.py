"""Bad requests to the OpenAI port, sent as raw HTTP: each gets its 4xx status and OpenAI's error object
(`{"error": {"message", "type", "param", "code"}}`), whether the frontend, its framework (routing, JSON
parsing, validation) or the `minions` model refuses it, and the port serves the next good request."""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import http_request

CHAT = {"model": "minions", "max_tokens": 4, "temperature": 0}
COMPLETION = {"model": "minions", "max_tokens": 4, "temperature": 0, "prompt": "Hi"}
HI = [{"role": "user", "content": "Hi"}]


def _chat(**fields) -> bytes:
    return json.dumps({**CHAT, "messages": HI, **fields}).encode()


def _completion(**fields) -> bytes:
    return json.dumps({**COMPLETION, **fields}).encode()


def _nested(depth: int) -> bytes:
    return ('{"model": "minions", "prompt": "Hi", "metadata": ' + "[" * depth + "]" * depth + "}").encode()


CHAT_PATH, COMPLETION_PATH = "/chat/completions", "/completions"

BAD_REQUESTS = {
    # name: (method, path under /v1, body, status, param, words the message holds)
    "lone surrogate in a chat message": ("POST", CHAT_PATH, b'{"model": "minions", "messages": [{"role": "user", '
                                         b'"content": "Hi \\ud800"}]}', 400, "messages.0.content", "surrogate"),
    "lone surrogate streamed": ("POST", CHAT_PATH, b'{"model": "minions", "stream": true, "messages": [{"role": '
                                b'"user", "content": "\\udfff"}]}', 400, "messages.0.content", "surrogate"),
    "lone surrogate in a prompt": ("POST", COMPLETION_PATH, b'{"model": "minions", "prompt": "a\\ud800b"}', 400,
                                   "prompt", "surrogate"),
    "lone surrogate in a stop string": ("POST", COMPLETION_PATH, b'{"model": "minions", "prompt": "a", '
                                        b'"stop": ["\\ud83d"]}', 400, "stop.0", "surrogate"),
    "user content null": ("POST", CHAT_PATH, _chat(messages=[{"role": "user", "content": None}]), 400,
                          "messages.0.content", "content"),
    "user content missing": ("POST", CHAT_PATH, _chat(messages=[{"role": "user"}]), 400, "messages.0.content",
                             "content"),
    "assistant content null": ("POST", CHAT_PATH, _chat(messages=[*HI, {"role": "assistant", "content": None}]),
                               400, "messages.1.content", "content"),
    "text part without text": ("POST", CHAT_PATH, _chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
                               400, "messages.0.content", "text"),
    "nested deeper than the parser goes": ("POST", COMPLETION_PATH, _nested(100_000), 400, None, "nested"),
    "not JSON": ("POST", COMPLETION_PATH, b'{"model": "minions", "prompt": ', 400, None, "JSON"),
    "not UTF-8": ("POST", COMPLETION_PATH, b'{"model": "minions", "prompt": "\xff\xfe"}', 400, None, "UTF-8"),
    "no body": ("POST", COMPLETION_PATH, b"", 400, None, "body"),
    "a list, not an object": ("POST", COMPLETION_PATH, b"[]", 400, None, "object"),
    "no messages": ("POST", CHAT_PATH, json.dumps({"model": "minions"}).encode(), 400, "messages", "required"),
    "NaN temperature": ("POST", COMPLETION_PATH, b'{"model": "minions", "prompt": "a", "temperature": NaN}', 400,
                        "temperature", "finite"),
    "infinite repetition penalty": ("POST", COMPLETION_PATH, b'{"model": "minions", "prompt": "a", '
                                    b'"repetition_penalty": Infinity}', 400, "repetition_penalty", "finite"),
    "max_tokens beyond INT32": ("POST", COMPLETION_PATH, _completion(max_tokens=2**31), 400, "max_tokens",
                                "2147483647"),
    "max_tokens above the server's limit": ("POST", COMPLETION_PATH, _completion(max_tokens=100_000), 400, None,
                                            "max_tokens"),
    "chat max_completion_tokens above the limit": ("POST", CHAT_PATH, _chat(max_completion_tokens=5000), 400, None,
                                                   "max_tokens"),
    "prompt longer than the context": ("POST", COMPLETION_PATH, _completion(prompt="word " * 3000), 400, None,
                                       "context"),
    "five stop strings": ("POST", COMPLETION_PATH, _completion(stop=list("abcde")), 400, "stop", "at most 4"),
    "a stop string too long": ("POST", COMPLETION_PATH, _completion(stop=["x" * 1000]), 400, "stop", "characters"),
    "n 2": ("POST", CHAT_PATH, _chat(n=2), 400, None, "n: one choice"),
    "unknown endpoint": ("POST", "/embeddings", _completion(), 404, None, "/v1/embeddings"),
    "wrong method": ("GET", CHAT_PATH, None, 405, None, "GET"),
    "body over the size limit": ("POST", COMPLETION_PATH, _completion(prompt="x" * (5 * 2**20)), 413, None, "bytes"),
}


def _error(status: int, text: str) -> dict:
    """The error object of an answer, checked to be OpenAI's shape."""
    body = json.loads(text)
    assert set(body) == {"error"}, text
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, text
    assert isinstance(error["message"], str) and error["message"], text
    if status in (400, 405, 413):
        assert error["type"] == "invalid_request_error", text
    return error


def _serves(openai_url: str) -> None:
    status, _, text = http_request(f"{openai_url}{COMPLETION_PATH}", _completion())
    assert status == 200 and json.loads(text)["choices"][0]["text"], text


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_gets_its_status_and_openais_error_object(openai_url, case):
    method, path, body, status, param, words = BAD_REQUESTS[case]
    answered, _, text = http_request(f"{openai_url}{path}", body, method=method)
    assert answered == status, text
    error = _error(status, text)
    assert words.lower() in error["message"].lower(), error
    if param is not None:
        assert error["param"] == param, error
    _serves(openai_url)


TRITON_RACE = "HandleCancellation called even when the context was not cancelled"
"""What Triton 2.51 logs for each stream it ends itself on an error (the `triton_grpc_error` header):
the path whose race with the stream's release crashed tritonserver with SIGSEGV (triton_stream.py)."""


def test_requests_the_model_refuses_end_no_stream_on_tritons_crashing_path(server, openai_url):
    before = server.log_text().count(TRITON_RACE)
    for _ in range(20):
        answered, _, text = http_request(f"{openai_url}{COMPLETION_PATH}", _completion(max_tokens=100_000))
        assert answered == 400 and "max_tokens" in _error(400, text)["message"], text
    assert server.log_text().count(TRITON_RACE) == before
    _serves(openai_url)


def test_a_body_sent_in_chunks_over_the_limit_gets_413(openai_url):
    """Without a Content-Length (urllib sends an iterable in chunks) the frontend counts the bytes as
    they arrive."""
    chunks = iter([_completion(prompt="x" * 2**20)[:-2]] + [b"x" * 2**20] * 5 + [b'"}'])
    answered, _, text = http_request(f"{openai_url}{COMPLETION_PATH}", chunks)
    assert answered == 413, text
    _error(413, text)
    _serves(openai_url)


def test_a_body_sent_as_a_form_says_to_send_json(openai_url):
    """curl -d sends application/x-www-form-urlencoded unless told otherwise."""
    answered, _, text = http_request(f"{openai_url}{COMPLETION_PATH}", _completion(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answered == 400, text
    assert "Content-Type: application/json" in _error(400, text)["message"], text
