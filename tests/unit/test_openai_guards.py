"""The OpenAI frontend's guards, without a server: text that is not Unicode, message content, the
request-size limits, the API key, OpenAI's error object for every error, and the 503's Retry-After.
The middlewares are driven as ASGI apps directly."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from minions.errors import INTERNAL_PREFIX, ModelUnavailable, ServerBusy
from minions.frontend.__main__ import build_app, parse_args
from minions.frontend.auth import API_KEY_ENV, API_KEY_FILE_ENV, RequireApiKey, api_key_from
from minions.frontend.errors import _validation_error, openai_error
from minions.frontend.limits import BodyLimit, check_stop
from minions.frontend.protocol import INT32_MAX, ChatCompletionRequest, CompletionRequest, OpenAIError, lone_surrogate
from minions.frontend.settings import FrontendSettings
from minions.frontend.triton_stream import TritonError, stream_error_code
from minions.settings import DEFAULTS


def test_a_lone_surrogate_is_found_by_its_path_however_deep():
    assert lone_surrogate({"messages": [{"role": "user", "content": "a\ud800"}]}) == ("messages.0.content", 1)
    assert lone_surrogate({"stop": ["ok", "\udfff"]}) == ("stop.1", 0)
    assert lone_surrogate({"x\udc00": 1}) == ("", 1)  # a key, at the top
    assert lone_surrogate({"prompt": "a pair is fine: \U0001f600"}) is None
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert lone_surrogate({"metadata": deep}) is None


def test_a_lone_surrogate_is_refused_naming_where():
    with pytest.raises(OpenAIError) as refused:
        ChatCompletionRequest(model="minions", messages=[{"role": "user", "content": "Hi \ud800"}])
    assert refused.value.status == 400 and refused.value.param == "messages.0.content"
    assert refused.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("role", ["user", "system", "assistant", "tool"])
def test_every_message_needs_text_content(role):
    with pytest.raises(ValidationError, match="content is required"):
        ChatCompletionRequest(model="minions", messages=[{"role": role, "content": None}])
    with pytest.raises(ValidationError, match="Field required"):
        ChatCompletionRequest(model="minions", messages=[{"role": role}])
    with pytest.raises(ValidationError, match="text content parts"):
        ChatCompletionRequest(model="minions", messages=[{"role": role, "content": [{"type": "text"}]}])
    empty = ChatCompletionRequest(model="minions", messages=[{"role": role, "content": ""}])
    assert empty.messages[0].as_minions()["content"] == ""


def test_numbers_must_be_finite_and_fit_the_models_inputs():
    with pytest.raises(ValidationError, match="finite"):
        CompletionRequest(model="minions", prompt="a", repetition_penalty=float("inf"))
    with pytest.raises(ValidationError, match="finite"):
        CompletionRequest(model="minions", prompt="a", temperature=float("nan"))
    with pytest.raises(ValidationError, match=str(INT32_MAX)):
        CompletionRequest(model="minions", prompt="a", max_tokens=INT32_MAX + 1)
    with pytest.raises(ValidationError, match=str(INT32_MAX)):
        ChatCompletionRequest(model="minions", messages=[{"role": "user", "content": "a"}], top_k=2**40)


def test_stop_strings_are_bounded_in_number_and_length():
    settings = FrontendSettings(max_stop_strings=2, max_stop_chars=3)
    check_stop(["abc", "de"], settings)
    with pytest.raises(OpenAIError, match="at most 2 stop strings, got 3") as many:
        check_stop(["a", "b", "c"], settings)
    with pytest.raises(OpenAIError, match="at most 3 characters, got one of 4") as long:
        check_stop(["abcd"], settings)
    assert many.value.param == long.value.param == "stop" and many.value.status == 400


def test_the_stop_limits_default_to_the_models():
    """One default each: the `minions` model refuses beyond its own on Triton's ports (minions.settings)."""
    assert (FrontendSettings().max_stop_strings, FrontendSettings().max_stop_chars) == \
        (DEFAULTS.limits.stop_strings, DEFAULTS.limits.stop_chars) == (4, 256)


def test_each_setting_is_a_flag_with_its_one_default():
    assert FrontendSettings.from_args(parse_args([])) == FrontendSettings()
    args = parse_args(["--max-body-bytes", "10", "--max-stop-chars", "7", "--retry-after-s", "3"])
    assert FrontendSettings.from_args(args) == FrontendSettings(max_body_bytes=10, max_stop_chars=7, retry_after_s=3)
    with pytest.raises(ValueError, match="max_body_bytes"):
        FrontendSettings(max_body_bytes=-1)


def test_the_api_key_comes_from_the_environment_or_a_file(tmp_path):
    assert api_key_from({}) is None and api_key_from({API_KEY_ENV: "  "}) is None
    assert api_key_from({API_KEY_ENV: "s3cret"}) == ("s3cret", API_KEY_ENV)
    file = tmp_path / "key"
    file.write_text("s3cret\n")
    assert api_key_from({API_KEY_FILE_ENV: str(file)})[0] == "s3cret"
    with pytest.raises(ValueError, match="not both"):
        api_key_from({API_KEY_ENV: "a", API_KEY_FILE_ENV: str(file)})
    file.write_text("\n")
    with pytest.raises(ValueError, match="holds no API key"):
        api_key_from({API_KEY_FILE_ENV: str(file)})
    with pytest.raises(ValueError, match="cannot read"):
        api_key_from({API_KEY_FILE_ENV: str(tmp_path / "missing")})


def test_start_up_says_whether_a_key_is_required_never_the_key(caplog):
    with caplog.at_level(logging.INFO, logger="minions.frontend"):
        build_app(parse_args([]), {API_KEY_ENV: "s3cret-value"})
        build_app(parse_args([]), {})
    assert f"API key: required on /v1, from {API_KEY_ENV}" in caplog.text
    assert "API key: none required" in caplog.text and "s3cret-value" not in caplog.text


def test_a_model_repository_without_the_model_is_refused_at_start_up(tmp_path):
    """--model-repository lets the frontend watch the orchestrator's stubs; pointed at the wrong folder
    it would watch nothing and end no orphan, so it says so and does not start."""
    with pytest.raises(ValueError, match="has no folder for the model 'minions'"):
        build_app(parse_args([f"--model-repository={tmp_path}"]), {})
    (tmp_path / "minions").mkdir()
    assert build_app(parse_args([f"--model-repository={tmp_path}"]), {})


def test_make_serve_passes_its_environment_to_the_frontend(monkeypatch):
    from minions.deploy.server import server_env

    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    assert server_env()[API_KEY_ENV] == "s3cret"


class _App:
    """An ASGI app that records the body it read and answers 200."""

    def __init__(self) -> None:
        self.body: bytes | None = None

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.body = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _call(app, path: str = "/v1/models", headers: dict[str, str] | None = None,
          chunks: tuple[bytes, ...] = (b"",)) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request through an ASGI app: status, headers, body."""
    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def _error(body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_without_the_key_v1_gets_401_and_health_stays_open():
    inner = _App()
    app = RequireApiKey(inner, "s3cret")
    status, headers, body = _call(app)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert _error(body)["code"] == "invalid_api_key" and inner.body is None  # refused before the body was read
    for wrong in ("Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"):
        assert _call(app, headers={"Authorization": wrong})[0] == 401, wrong
    assert _call(app, "/v1/unknown")[0] == 401
    assert _call(app, headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert _call(app, headers={"Authorization": "bearer  s3cret"})[0] == 200
    assert _call(app, "/health")[0] == 200 and _call(app, "/v1x")[0] == 200  # not under /v1


def test_a_body_over_the_limit_gets_413_and_any_other_reaches_the_app_whole():
    inner = _App()
    app = BodyLimit(inner, max_bytes=10)
    assert _call(app, chunks=(b"12345", b"67890"))[0] == 200 and inner.body == b"1234567890"
    status, _, body = _call(app, chunks=(b"12345", b"67890", b"1"))
    assert status == 413 and _error(body)["type"] == "invalid_request_error" and "limit of 10 bytes" in body.decode()
    inner.body = None
    assert _call(app, headers={"Content-Length": "11"}, chunks=(b"x" * 11,))[0] == 413 and inner.body is None


def test_a_refusal_for_load_is_503_with_retry_after():
    busy = openai_error(TritonError(grpc.StatusCode.UNAVAILABLE, f"{ServerBusy.PREFIX} (2 decoding)"), 7)
    assert busy.status == 503 and busy.headers == {"Retry-After": "7"} and busy.code == "server_busy"
    untyped = openai_error(TritonError(grpc.StatusCode.UNKNOWN, f"{ServerBusy.PREFIX} (2 decoding)"))
    assert untyped.status == 503 and untyped.headers["Retry-After"] == str(FrontendSettings.retry_after_s)
    assert openai_error(TritonError(grpc.StatusCode.INVALID_ARGUMENT, "bad")).headers == {}


def test_a_check_of_several_fields_keeps_its_own_message():
    whole = RequestValidationError([{"type": "value_error", "loc": ("body",), "msg": "Value error, n: send n 1"}])
    assert _validation_error(whole).message == "n: send n 1"
    missing = RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert _validation_error(missing).message == "the request needs a JSON body"


def test_a_refusal_after_the_first_token_is_an_sse_error_event():
    """Headers are sent once a stream has its first token: what fails later can only be an event."""
    from minions.frontend.app import _events
    from minions.frontend.translate import Generation

    async def responses():
        yield {"text_output": "Hel", "num_output_tokens": 1}
        raise TritonError(grpc.StatusCode.UNAVAILABLE, f"{ServerBusy.PREFIX} (2 decoding)")

    async def events() -> list[bytes]:
        stream = responses()
        first = await anext(stream)
        return [event async for event in _events(stream, first, Generation("chat.completion", "minions"), "", False)]

    sent = asyncio.run(events())
    assert sent[-1] == b"data: [DONE]\n\n"
    error = json.loads(sent[-2].decode().removeprefix("data: "))["error"]
    assert error["code"] == "server_busy" and error["type"] == "service_unavailable"
    assert json.loads(sent[1].decode().removeprefix("data: "))["choices"][0]["delta"]["content"] == "Hel"


def test_a_failed_requests_status_is_read_from_its_message():
    """Triton's stream carries a failed request's message without a status (triton_stream.py)."""
    assert stream_error_code(f"{ServerBusy.PREFIX} (2 decoding)") == grpc.StatusCode.UNAVAILABLE
    assert stream_error_code(f"{ModelUnavailable.PREFIX}: llm is loading") == grpc.StatusCode.UNAVAILABLE
    assert stream_error_code("Request for unknown model: 'minions' is not found") == grpc.StatusCode.UNAVAILABLE
    # sent to a dead orchestrator stub before make serve's watchdog has loaded it again: retry, not 400
    assert stream_error_code("Stub process 'minions_0_0' is not healthy.") == grpc.StatusCode.UNAVAILABLE
    assert stream_error_code(f"{INTERNAL_PREFIX}: EngineCallError: llm died") == grpc.StatusCode.INTERNAL
    assert stream_error_code("'max_tokens' must be in [1, 1024], got 100000") == grpc.StatusCode.INVALID_ARGUMENT
    assert openai_error(TritonError(stream_error_code(f"{INTERNAL_PREFIX}: x"), "x")).status == 500
