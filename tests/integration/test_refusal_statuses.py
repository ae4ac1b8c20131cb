"""What each of Triton's own endpoints gives a client when the `minions` model refuses a request for
load (pb_utils.TritonError.UNAVAILABLE, a message starting with ServerBusy.PREFIX), pinned for Triton
2.51, as docs/api.md and docs/operations.md tell operators:

- gRPC stream (ModelStreamInfer): the message alone, no status (the stream's response has only
  `error_message`); with the `triton_grpc_error: true` header, gRPC's UNAVAILABLE, and the stream ends;
- HTTP generate and generate_stream: 400 with the message, not 503: Triton 2.51 reads the status off the
  model's error after it has freed it (http_server.cc, GenerateRequestClass::InferResponseComplete), so
  every error a decoupled model sends comes back 400 whatever its code.

Runs its own server that decodes one request at a time and queues one more: one stream that cannot end
on its own for a while (min_tokens = max_tokens) holds the slot, and of two more requests one waits in
the queue and the other is refused; from then on, every request is refused until the slot is freed.
"""

from __future__ import annotations

import json
import queue

import tritonclient.grpc as grpcclient

from minions.errors import ServerBusy
from tests.integration.helpers import metric_value, wait_until
from tests.integration.triton_calls import DEADLINE_S, GRPC_ERROR_HEADER, grpc_stream, http_generate, tensors

SENDS_GRPC_ERROR_HEADER = True
"""Its server may hit Triton 2.51's crash after a stream the header ended (conftest TRITON_HEADER_RACE)."""
SHORT = {"text_input": "Name three animals.", "max_tokens": 4}
HOLD = {"text_input": "Count upwards from one:", "max_tokens": 1024, "min_tokens": 1024, "stream": True,
        "speculation": "off"}


class Stream:
    """One request on its own gRPC stream, left open: its answers arrive in `answers` (a queue of its
    own unless given one)."""

    def __init__(self, url: str, inputs: dict, answers: queue.Queue | None = None) -> None:
        self.answers: queue.Queue = answers if answers is not None else queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)),
                                 stream_timeout=DEADLINE_S)
        self.client.async_stream_infer("minions", tensors(inputs))

    def next(self):
        """The next answer, (result, error); an error here if none comes before the deadline."""
        return self.answers.get(timeout=DEADLINE_S)

    def close(self, cancel: bool) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _busy(message: str) -> bool:
    return message.startswith(ServerBusy.PREFIX)


def test_what_each_endpoint_gives_for_a_refusal_for_load(one_slot_server):
    server = one_slot_server
    refused_before = metric_value(server.metrics_url, "minions_requests", outcome="unavailable")
    holder = Stream(server.grpc_url, HOLD)
    fillers: list[Stream] = []
    try:
        result, error = holder.next()  # its first text: it decodes, in the one slot
        assert error is None and result is not None, error
        either: queue.Queue = queue.Queue()
        fillers += [Stream(server.grpc_url, SHORT, either) for _ in range(2)]  # one waits, one is refused
        result, error = either.get(timeout=DEADLINE_S)
        assert result is None and _busy(error.message()), (result, error)

        # The queue stays full while the slot is held: every endpoint's answer to a refusal, today.
        plain = grpc_stream(server.grpc_url, tensors(SHORT))
        assert not plain.results and len(plain.errors) == 1, plain
        assert _busy(plain.errors[0].message()) and plain.errors[0].status() is None, "gRPC stream: no status"

        typed = grpc_stream(server.grpc_url, tensors(SHORT), headers=GRPC_ERROR_HEADER)
        assert not typed.results and len(typed.errors) == 1, typed
        assert _busy(typed.errors[0].message()) and typed.errors[0].status() == "StatusCode.UNAVAILABLE"

        for stream in (False, True):
            status, answers = http_generate(server.http_url, json.dumps(SHORT), stream)
            assert len(answers) == 1 and _busy(answers[0]["error"]), answers
            assert status == 400, f"generate{'_stream' if stream else ''}: {status}, not Triton 2.51's 400"
    finally:
        holder.close(cancel=True)  # the slot frees: the queued request is served
    result, error = either.get(timeout=DEADLINE_S)
    assert error is None and result is not None, f"the queued request is served once the slot frees: {error}"
    for filler in fillers:
        filler.close(cancel=False)
    wait_until(lambda: metric_value(server.metrics_url, "minions_requests", outcome="unavailable")
               >= refused_before + 5, timeout=30, what="five requests counted unavailable")


def test_invalid_input_has_its_own_status_only_where_triton_carries_one(one_slot_server):
    """Beside a refusal for load, INVALID_ARG: gRPC's INVALID_ARGUMENT with the `triton_grpc_error`
    header, no status without it, and HTTP 400 (any model error is 400 there). On this module's own
    server, not the shared one: a stream the header ends can crash Triton 2.51 (frontend/triton_stream.py)."""
    server = one_slot_server
    bad = {"text_input": "hi", "max_tokens": 0}
    plain = grpc_stream(server.grpc_url, tensors(bad))
    assert len(plain.errors) == 1 and plain.errors[0].status() is None, plain
    typed = grpc_stream(server.grpc_url, tensors(bad), headers=GRPC_ERROR_HEADER)
    assert len(typed.errors) == 1 and typed.errors[0].status() == "StatusCode.INVALID_ARGUMENT", typed
    assert "'max_tokens' must be in" in typed.errors[0].message()
    for stream in (False, True):
        assert http_generate(server.http_url, json.dumps(bad), stream)[0] == 400
