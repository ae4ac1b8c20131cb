"""Every error the OpenAI frontend answers, as OpenAI's error object
(`{"error": {"message", "type", "param", "code"}}`): the frontend's own refusals, Triton's, and the
framework's (routing 404/405, a body that is not JSON or nests too deep, validation), which FastAPI
would otherwise answer as `{"detail": ...}`."""

from __future__ import annotations

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from minions.errors import is_refusal
from minions.frontend.protocol import OpenAIError
from minions.frontend.settings import FrontendSettings
from minions.frontend.triton_stream import TritonError

HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
               grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
               grpc.StatusCode.CANCELLED: 499}
"""Triton's status for a failed request -> the HTTP status answered (500 for any other)."""


def openai_error(exc: TritonError, retry_after_s: int = FrontendSettings.retry_after_s) -> OpenAIError:
    """Triton's refusal as the HTTP answer. A 503 (the server at capacity, or Triton unreachable) says
    when to retry; a refusal is recognised by its message too (minions.errors.is_refusal), should it
    come without its status."""
    busy = is_refusal(str(exc))
    status = 503 if busy else HTTP_STATUS.get(exc.code, 500)
    if status != 503:
        return OpenAIError(status, str(exc))
    return OpenAIError(503, str(exc), code="server_busy", headers={"Retry-After": str(retry_after_s)})


def answer(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _validation_error(exc: RequestValidationError, content_type: str = "application/json") -> OpenAIError:
    """Pydantic's first complaint, naming the field (`messages.0.content`) as `param`. A body sent as
    another content type (curl -d's form encoding) is not parsed as JSON: the answer says so."""
    first = exc.errors()[0]
    where = tuple(first.get("loc", ()))[1:]  # after "body"
    kind, message = first.get("type"), str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if kind == "json_invalid":
        return OpenAIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', message)} "
                                f"(at character {where[0] if where else 0})")
    if not where:  # the body as a whole, or a check of several fields (which names them)
        if kind == "missing":
            message = "the request needs a JSON body"
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            message = (f"the body must be a JSON object: {message}" if "json" in content_type else
                       f"the body must be JSON, sent as Content-Type: application/json (not {content_type})")
        return OpenAIError(400, message)
    param = ".".join(str(p) for p in where)
    return OpenAIError(400, f"{param}: {message}", param)


def _http_error(request: Request, exc: HTTPException) -> OpenAIError:
    """The framework's own refusals, said as what to change."""
    endpoint = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        message = f"unknown endpoint: {endpoint}"
    elif exc.status_code == 405:
        allowed = {name.lower(): value for name, value in (exc.headers or {}).items()}.get("allow", "another method")
        message = f"{endpoint} is not allowed; use {allowed}"
    elif exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
        message = "the JSON body is nested too deeply to parse"
    elif exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        message = "the body is not valid UTF-8 text"
    else:
        message = str(exc.detail)
    return OpenAIError(exc.status_code, message, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error `app` can raise as OpenAI's error object."""

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(_validation_error(exc, request.headers.get("content-type", "application/json")))

    @app.exception_handler(HTTPException)
    async def _framework(request: Request, exc: HTTPException) -> JSONResponse:
        return answer(_http_error(request, exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        """A bug: still OpenAI's object (the traceback goes to the log, as uvicorn logs it)."""
        return answer(OpenAIError(500, f"the server failed on {request.method} {request.url.path} "
                                       f"({type(exc).__name__}); its log has the details"))
