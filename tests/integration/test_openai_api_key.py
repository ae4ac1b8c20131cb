"""The optional API key on the OpenAI port, given as `make serve` would pass it (the frontend's
environment): MINIONS_API_KEY, or MINIONS_API_KEY_FILE naming a file. Every /v1 request without
`Authorization: Bearer <key>` gets OpenAI's 401; /health stays open."""

from __future__ import annotations

import json

import openai
import pytest

from minions.frontend.auth import API_KEY_ENV, API_KEY_FILE_ENV
from tests.integration.helpers import http_request
from harness.openai_frontend import openai_frontend

KEY = "sk-minions-test-0123456789"


@pytest.fixture(scope="module", params=["env", "file"])
def keyed_url(request, server, tmp_path_factory):
    """A frontend that requires KEY, given inline or in a file."""
    if request.param == "env":
        env = {API_KEY_ENV: KEY}
    else:
        file = tmp_path_factory.mktemp("secret") / "api_key"
        file.write_text(KEY + "\n")
        env = {API_KEY_FILE_ENV: str(file)}
    with openai_frontend(server, env=env) as url:
        yield url


def _assert_401(status: int, headers: dict[str, str], text: str) -> None:
    assert status == 401, text
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key", error
    assert KEY not in text and {k.lower(): v for k, v in headers.items()}["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {KEY}", KEY, f"Bearer {KEY}x"])
def test_without_the_key_every_v1_request_gets_401(keyed_url, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    body = json.dumps({"model": "minions", "prompt": "Hi", "max_tokens": 2, "stream": True}).encode()
    _assert_401(*http_request(f"{keyed_url}/models", method="GET", headers=headers))
    _assert_401(*http_request(f"{keyed_url}/completions", body, headers=headers))
    _assert_401(*http_request(f"{keyed_url}/no-such-endpoint", method="GET", headers=headers))


def test_with_the_key_requests_are_served_and_health_needs_none(keyed_url):
    health = keyed_url.removesuffix("/v1") + "/health"
    assert http_request(health, method="GET")[0] == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_url, api_key="wrong", max_retries=0).models.list()
    api = openai.OpenAI(base_url=keyed_url, api_key=KEY, max_retries=0, timeout=120)
    answer = api.chat.completions.create(model="minions", messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens > 0
    status, _, text = http_request(f"{keyed_url}/no-such-endpoint", method="GET",
                                   headers={"Authorization": f"Bearer {KEY}"})
    assert status == 404, text
