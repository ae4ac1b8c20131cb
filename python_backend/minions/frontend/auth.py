"""The optional API key, as vLLM's and llama-server's `--api-key`: when one is set, every /v1 request
must carry `Authorization: Bearer <key>`, else it gets 401; /health stays open.

The key comes from the environment only, never from deploy.yaml (a file kept with the code):
MINIONS_API_KEY holds it, or MINIONS_API_KEY_FILE names a file that does (a secret mounted by
Docker or Kubernetes). `make serve` passes its environment on to the frontend.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from minions.frontend.errors import answer
from minions.frontend.protocol import OpenAIError

API_KEY_ENV = "MINIONS_API_KEY"
API_KEY_FILE_ENV = "MINIONS_API_KEY_FILE"
GUARDED_PREFIX = "/v1"


def api_key_from(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(the key, where it came from), or None when neither variable is set (or is empty). Surrounding
    whitespace is not part of the key (a file's last newline; a header cannot carry it anyway).
    Raises ValueError when both are set, or the file is unreadable or holds no key."""
    inline, file = environ.get(API_KEY_ENV, "").strip(), environ.get(API_KEY_FILE_ENV, "").strip()
    if inline and file:
        raise ValueError(f"set {API_KEY_ENV} or {API_KEY_FILE_ENV}, not both")
    if inline:
        return inline, API_KEY_ENV
    if not file:
        return None
    try:
        key = Path(file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{API_KEY_FILE_ENV}: cannot read the API key from {file}: {exc}") from None
    if not key:
        raise ValueError(f"{API_KEY_FILE_ENV}: {file} holds no API key")
    return key, f"{API_KEY_FILE_ENV} ({file})"


def _bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class RequireApiKey:
    """ASGI middleware: a /v1 request without the key gets OpenAI's 401 (`invalid_api_key`) before
    anything else reads it. The key is compared in constant time."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope["path"]) and not self._authorized(scope):
            refusal = OpenAIError(401, "this server requires an API key: send the header "
                                       "'Authorization: Bearer <key>' with the key it was started with",
                                  code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await answer(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _guarded(path: str) -> bool:
        return path == GUARDED_PREFIX or path.startswith(GUARDED_PREFIX + "/")

    def _authorized(self, scope: Scope) -> bool:
        token = _bearer_token(scope)
        return token is not None and hmac.compare_digest(token, self.key)
