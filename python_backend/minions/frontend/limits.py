"""The frontend's request-size limits (FrontendSettings): a body over `max_body_bytes` gets 413 before
it is parsed, and too many or too long stop strings get 400. The prompt's and `max_tokens`' limits are
the `minions` model's own (the context, `max_tokens_limit`): it refuses past them with 400."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minions.frontend.errors import answer
from minions.frontend.protocol import OpenAIError
from minions.frontend.settings import FrontendSettings


def check_stop(stops: list[str], settings: FrontendSettings) -> None:
    """Raise OpenAIError (400, param `stop`) for more stop strings, or a longer one, than allowed:
    each is matched against the generated text at every token."""
    if len(stops) > settings.max_stop_strings:
        raise OpenAIError(400, f"stop: at most {settings.max_stop_strings} stop strings, got {len(stops)}", "stop")
    if (longest := max((len(s) for s in stops), default=0)) > settings.max_stop_chars:
        raise OpenAIError(400, f"stop: a stop string may hold at most {settings.max_stop_chars} characters, "
                               f"got one of {longest}", "stop")


DRAIN_FACTOR = 16
"""A refused body is still read (and dropped) up to this many times the limit before the 413: a client
that is still sending when the server closes the connection gets a reset, not the answer."""


class BodyLimit:
    """ASGI middleware: a request whose body exceeds `max_bytes` (declared by Content-Length, or counted
    as chunks arrive) gets OpenAI's 413; the app gets the body of any other request, read whole first."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, f"{declared} bytes", more=True)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: the app hears it
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send=send, size=f"more than {self.max_bytes} bytes", more=more)
                return
            if not more:
                message = {"type": "http.request", "body": bytes(body), "more_body": False}
                break
        await self.app(scope, _replay(message, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str, more: bool) -> None:
        drained = 0
        while more and drained < DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            drained += len(message.get("body", b""))
            more = message["type"] == "http.request" and message.get("more_body", False)
        refusal = OpenAIError(413, f"the request body ({size}) is over this server's limit of {self.max_bytes} "
                                   "bytes (--max-body-bytes)", code="request_too_large")
        await answer(refusal)(scope, receive, send)


def _replay(first: Message, receive: Receive) -> Receive:
    """`receive` that gives `first` once, then whatever the client sends next (its disconnect)."""
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed
