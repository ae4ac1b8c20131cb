"""Refusals for load on the OpenAI port: when the `minions` model refuses a request because its wait
queue is full (ServerBusy, counted `unavailable`), the port answers 503 with Retry-After and OpenAI's
error object, streamed or not (the refusal comes before any token, so a stream gets a status too).

Runs its own server that decodes one request at a time and queues one more, so the state "full" is
made by the test and needs no timing: one stream that cannot end on its own (min_tokens = max_tokens)
holds the slot, and of two more requests one waits in the queue and the other is refused.
"""

from __future__ import annotations

import json
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import openai
import pytest

from minions.errors import ServerBusy
from minions.frontend.settings import FrontendSettings
from tests.integration.helpers import http_request, metric_value, wait_until
from harness.openai_frontend import openai_frontend

SHORT = {"model": "minions", "prompt": "Name three animals.", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def one_slot_url(one_slot_server):
    with openai_frontend(one_slot_server) as url:
        yield url


def _post(url: str, **fields) -> tuple[int, dict[str, str], str]:
    return http_request(f"{url}/completions", json.dumps({**SHORT, **fields}).encode())


def _assert_busy(status: int, headers: dict[str, str], text: str) -> None:
    assert status == 503, text
    assert {k.lower(): v for k, v in headers.items()}.get("retry-after") == str(FrontendSettings.retry_after_s), headers
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == "server_busy" and error["message"].startswith(ServerBusy.PREFIX), error


def test_a_refusal_for_load_is_503_with_retry_after_streamed_or_not(one_slot_server, one_slot_url):
    refused_before = metric_value(one_slot_server.metrics_url, "minions_requests", outcome="unavailable")
    api = openai.OpenAI(base_url=one_slot_url, api_key="unused", max_retries=0, timeout=120)
    holder = api.completions.create(model="minions", prompt="Count upwards from one:", max_tokens=1024,
                                    temperature=0, stream=True, extra_body={"min_tokens": 1024})
    with ThreadPoolExecutor(2) as pool:
        try:
            next(iter(holder))  # its first text: it decodes, in the one slot
            pending = {pool.submit(_post, one_slot_url) for _ in range(2)}
            done, pending = wait(pending, return_when=FIRST_COMPLETED)  # the one refused; the other waits
            _assert_busy(*done.pop().result())
            _assert_busy(*_post(one_slot_url))  # the queue stays full while the slot is held
            _assert_busy(*_post(one_slot_url, stream=True))
        finally:
            holder.close()  # the slot frees: the queued request is served
        status, _, text = pending.pop().result()
    assert status == 200 and json.loads(text)["choices"][0]["text"], text
    wait_until(lambda: metric_value(one_slot_server.metrics_url, "minions_requests", outcome="unavailable")
               >= refused_before + 3, timeout=30, what="three requests counted unavailable")
