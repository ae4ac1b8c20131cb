"""Locust users streaming generations from a Minions server: HTTP (Triton's generate_stream, SSE),
gRPC (bidirectional stream to the decoupled `minions` model) and OpenAI (chat completions at
--openai-host, which may be another server: llama-server is measured with the very same user), all
through client.api.

Every request fires Locust events: E2E (the request itself: its success or failure, response time =
send to last response, length = output tokens) and, when it succeeds, TTFT (send to first text) and ITL
(the request's mean inter-token latency, (E2E - TTFT) / (tokens - 1)). A server error, a stream that
ends without its final response, or one silent for --response-timeout s (then cancelled) is a failure.
With --records, each user also appends one JSON line per request (loadtest.records) for the summary.

`python -m loadtest.run` runs this headless; by hand, against `make serve`:

    .venv/bin/locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --grpc-host 127.0.0.1:8001
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import gevent
import grpc.experimental.gevent as grpc_gevent
from locust import User, events, task
from locust.stats import CSV_STATS_INTERVAL_SEC

from client.api import Completion, GenerationParams, generate_grpc, generate_http, generate_openai
from loadtest.options import add_options, prompts
from loadtest.records import RequestRecord, append_record, outcome_of
from minions.text.datasets import MissingPromptSet

# Locust has monkey-patched the standard library for gevent; gRPC's core needs this too, before its
# first channel, or a blocking stream read stalls every user of the process.
grpc_gevent.init_gevent()

MODEL = "minions"
FAILURE_PAUSE_S = 1.0


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    add_options(parser, with_env=True)


@events.init.add_listener
def _load_prompts(environment, **_) -> None:
    """Load the prompts as Locust starts: a prompt set that is not there ends it with one line, before a
    user runs (a user would die on it with a traceback, and the run record nothing)."""
    try:
        workload(environment.parsed_options)
    except MissingPromptSet as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


@events.test_stop.add_listener
def _last_csv_write(environment, **_) -> None:
    """Locust rewrites its CSV files every CSV_STATS_INTERVAL_SEC, not at exit, so requests that end after
    --run-time (within --stop-timeout) would be missing from them (locust issues 1806, 2299): the users
    have stopped here; give the writer one more turn."""
    if getattr(environment.parsed_options, "csv_prefix", None):
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.5)


class IncompleteStream(RuntimeError):
    """The stream ended without the server's final response (no finish reason)."""


@dataclass
class Workload:
    """What every user of this process sends: the prompts (cycled) and the request parameters."""

    prompts: Iterator[str]
    params: GenerationParams
    timeout_s: float
    records: str


_workload: Workload | None = None


def workload(options) -> Workload:
    """Built once per process from the parsed options (loading the prompts once)."""
    global _workload
    if _workload is None:
        params = GenerationParams(max_tokens=options.max_tokens, temperature=options.temperature,
                                  speculation=options.speculation or None, chat=True, return_perf_metrics=True)
        _workload = Workload(itertools.cycle(prompts(options)), params, options.response_timeout, options.records)
    return _workload


class _StreamUser(User):
    """One closed-loop stream: sends the next prompt as soon as its last request ended (a second later
    after a failure)."""

    abstract = True
    protocol = ""
    last_failed = False

    def wait_time(self) -> float:
        """None between requests; FAILURE_PAUSE_S after a failure, so a dead server is not spun on."""
        return FAILURE_PAUSE_S if self.last_failed else 0.0

    def call(self, prompt: str, w: Workload) -> Completion:
        raise NotImplementedError

    @task
    def generate(self) -> None:
        w = workload(self.environment.parsed_options)
        prompt = next(w.prompts)
        start, t0 = time.time(), time.perf_counter()
        try:
            completion = self.call(prompt, w)
            if completion.finish_reason is None:
                raise IncompleteStream(f"the stream ended after {len(completion.chunks)} chunks without a final "
                                       "response")
        except Exception as exc:  # reported as a failure, never dropped; the user goes on
            self._report(w, RequestRecord(self.protocol, start, time.perf_counter() - t0, outcome_of(exc),
                                          error=str(exc)), exc)
            return
        self._report(w, RequestRecord(self.protocol, start, completion.latency_s, ttft_s=completion.ttft_s,
                                      output_tokens=completion.num_output_tokens, chunks=len(completion.chunks)))

    def _report(self, w: Workload, record: RequestRecord, exc: Exception | None = None) -> None:
        fire = self.environment.events.request.fire
        name = f"{self.protocol} {MODEL}"
        fire(request_type="E2E", name=name, response_time=1000 * record.e2e_s, response_length=record.output_tokens,
             exception=exc, context={"outcome": record.outcome})
        if record.ok and record.ttft_s is not None:
            fire(request_type="TTFT", name=name, response_time=1000 * record.ttft_s, response_length=0,
                 exception=None, context={})
        if record.ok and record.itl_s is not None:
            fire(request_type="ITL", name=name, response_time=1000 * record.itl_s, response_length=0,
                 exception=None, context={})
        if w.records:
            append_record(w.records, record)
        self.last_failed = not record.ok


class HttpStreamUser(_StreamUser):
    """POST {host}/v2/models/minions/generate_stream, read as server-sent events."""

    protocol = "http"

    def call(self, prompt: str, w: Workload) -> Completion:
        return generate_http(self.host, MODEL, prompt, w.params, stream=True, timeout_s=w.timeout_s)


class GrpcStreamUser(_StreamUser):
    """ModelStreamInfer on --grpc-host: one request per stream, responses until the final one."""

    protocol = "grpc"

    def call(self, prompt: str, w: Workload) -> Completion:
        return generate_grpc(self.environment.parsed_options.grpc_host, MODEL, prompt, w.params, stream=True,
                             timeout_s=w.timeout_s)


class OpenAIStreamUser(_StreamUser):
    """POST {--openai-host}/chat/completions, streamed, read as OpenAI's clients read it."""

    protocol = "openai"

    def call(self, prompt: str, w: Workload) -> Completion:
        options = self.environment.parsed_options
        return generate_openai(options.openai_host, options.openai_model, prompt, w.params, timeout_s=w.timeout_s)
