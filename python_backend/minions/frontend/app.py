"""The OpenAI-compatible HTTP service (FastAPI): /v1/models, /v1/completions, /v1/chat/completions.

Every request becomes one generation on the `minions` model over Triton's gRPC streaming endpoint
(triton_stream.py). A streamed answer is sent as server-sent events ending with `data: [DONE]`; a
client that disconnects cancels its stream, and Triton cancels the request in the model. Errors are
OpenAI's error JSON (errors.py): 400 for a request to change, 401 without the API key (auth.py), 404 for
an unknown model, 413 for a body over the limit (limits.py), 503 with Retry-After when the server is at
capacity, 500 otherwise. A stream that fails after it started sends the error as an event, then [DONE].
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from minions.frontend.auth import RequireApiKey
from minions.frontend.errors import install_error_handlers, openai_error
from minions.frontend.health import ReplicaHealth
from minions.frontend.limits import BodyLimit, check_stop
from minions.frontend.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from minions.frontend.settings import FrontendSettings
from minions.frontend.translate import Generation, chat_inputs, completion_inputs, sse
from minions.frontend.triton_stream import TritonError, TritonStream

log = logging.getLogger("minions.frontend")

DISCONNECT_POLL_S = 0.1
"""How often a non-streamed request checks whether its client is still there."""


def create_app(triton: TritonStream, model: str, settings: FrontendSettings = FrontendSettings(),
               api_key: str | None = None, health: ReplicaHealth | None = None) -> FastAPI:
    """The service for `model` (the name clients send, and /v1/models lists) served through `triton`;
    with `api_key`, /v1 answers only requests that carry it. /health answers 200 while `health` (by
    default Triton's readiness of the orchestrator and its LLM) finds nothing in the way, else 503 with
    the reason; each change is logged once."""
    app = FastAPI(title="Minions OpenAI-compatible API")
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if api_key:
        app.add_middleware(RequireApiKey, key=api_key)  # added last, so it runs first: no key, no body read
    started = int(time.time())

    def card() -> dict[str, Any]:
        return {"id": model, "object": "model", "created": started, "owned_by": "minions"}

    checks = health or ReplicaHealth(triton)

    @app.get("/health")
    async def health_check() -> JSONResponse:
        reason = await checks.check()
        if reason is None:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)

    # What the SGLang Model Gateway asks a worker it adds (its discovery falls back to the deprecated
    # /get_* names, warning, on a 404): the model's name, and that it generates.
    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {"served_model_name": model, "is_generation": True}

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return {"served_model_name": model}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{name}")
    async def model_card(name: str) -> dict[str, Any]:
        if name != model:
            raise _unknown_model(name)
        return card()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        gen = Generation("text_completion", model, body.wants_log_probs)
        return await _serve(request, body, inputs=completion_inputs(body), gen=gen,
                            prefix=body.prompt if body.echo else "")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        gen = Generation("chat.completion", model, body.wants_log_probs)
        return await _serve(request, body, inputs=chat_inputs(body), gen=gen)

    def _unknown_model(name: str) -> OpenAIError:
        return OpenAIError(404, f"the model {name!r} does not exist; this server serves {model!r}", "model",
                           "model_not_found")

    async def _serve(request: Request, body, inputs: dict[str, Any], gen: Generation, prefix: str = ""):
        if body.model != model:
            raise _unknown_model(body.model)
        check_stop(body.stop_words(), settings)
        responses = _Logged(triton.generate(inputs, gen.id), gen, request.url.path)
        if not body.stream:
            await _until_disconnected(request, _gather(responses, gen, settings.retry_after_s))
            return gen.body(prefix)
        try:  # the first response before the headers: a refused request gets its status, not a broken stream
            first = await _until_disconnected(request, anext(responses, None))  # it may wait for a slot
        except TritonError as exc:
            raise openai_error(exc, settings.retry_after_s) from None
        return StreamingResponse(_events(responses, first, gen=gen, prefix=prefix, include_usage=body.include_usage),
                                 media_type="text/event-stream")

    return app


async def _gather(responses: AsyncIterator[dict[str, Any]], gen: Generation, retry_after_s: int) -> None:
    try:
        async for outputs in responses:
            gen.add(outputs)
    except TritonError as exc:
        raise openai_error(exc, retry_after_s) from None


async def _until_disconnected(request: Request, work):
    """`work`'s result; if the client disconnects first, cancel it (which cancels the request in
    Triton). A request queued for a free slot can wait long before its first token."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait([task], timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                raise OpenAIError(499, "the client disconnected")
        return task.result()
    finally:
        task.cancel()


async def _events(responses: AsyncIterator[dict[str, Any]], first: dict[str, Any] | None, gen: Generation,
                  prefix: str, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE body: chunks of new text, one with the finish reason, usage if asked, then [DONE].
    Starlette cancels this generator when the client disconnects; closing `responses` then cancels
    the request in Triton."""
    try:
        if gen.chat:
            yield sse(gen.chunk("", first=True))
        elif prefix:  # a completion's echo
            yield sse(gen.chunk(prefix))
        pending = [first] if first is not None else []
        async for outputs in _chain(pending, responses):
            text = gen.add(outputs)
            if text or gen.with_log_probs and gen.new_log_probs:
                yield sse(gen.chunk(text, log_probs=gen.new_log_probs if gen.with_log_probs else None))
        yield sse(gen.chunk(finish_reason=gen.finish_reason))
        if include_usage:
            yield sse(gen.usage_chunk())
    except TritonError as exc:
        yield sse(openai_error(exc).body())
    finally:
        await responses.aclose()
    yield sse("[DONE]")


async def _chain(first: list[dict[str, Any]], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for outputs in first:
        yield outputs
    async for outputs in rest:
        yield outputs


class _Logged:
    """A generation's responses, with one log line when it ends: its id, endpoint, outcome, tokens, time."""

    def __init__(self, responses: AsyncIterator[dict[str, Any]], gen: Generation, endpoint: str) -> None:
        self.responses, self.gen, self.endpoint = responses, gen, endpoint
        self.start = time.perf_counter()
        self.outcome: str | None = None

    def __aiter__(self):
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return await anext(self.responses)
        except StopAsyncIteration:
            self._end("finished")
            raise
        except TritonError as exc:
            self._end(f"failed ({exc.code.name}: {exc})")
            raise
        except (asyncio.CancelledError, GeneratorExit):
            self._end("cancelled (the client left)")
            raise

    async def aclose(self) -> None:
        if self.outcome is None:
            self._end("cancelled (the client left)")
        await self.responses.aclose()

    def _end(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            log.info("%s %s: %s, %d prompt + %d completion tokens in %.2f s", self.gen.id, self.endpoint, outcome,
                     self.gen.prompt_tokens, self.gen.completion_tokens, time.perf_counter() - self.start)
