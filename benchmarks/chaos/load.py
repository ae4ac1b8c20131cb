"""A chaos run's load: client threads, each a closed loop of streamed requests over a random protocol
and speculation mode, every ending recorded."""

from __future__ import annotations

import itertools
import random
import threading
import time

import openai

from client.api import Completion, GenerationParams, generate_grpc, generate_http
from harness.triton_process import TritonProcess

from .verdict import MODES, PROTOCOLS, SERVED, RequestResult, classify

def generate_openai(url: str, model: str, prompt: str, params: GenerationParams, stream: bool = True,
                    timeout_s: float = 600.0) -> Completion:
    """`params` as a chat completion through the OpenAI frontend at `url` (its /v1), read as the client
    library reads Triton's answers; silent for `timeout_s` between two chunks raises APITimeoutError."""
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout_s)
    start = time.monotonic()
    completion = Completion()
    answer = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=params.max_tokens, temperature=0,
        stream=stream, stream_options={"include_usage": True} if stream else None,
        extra_body={"speculation": params.speculation} if params.speculation else None)
    for chunk in answer if stream else [answer]:
        if chunk.usage is not None:
            completion.num_input_tokens = chunk.usage.prompt_tokens
            completion.num_output_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text = choice.delta.content if stream else choice.message.content
            if text:
                completion.ttft_s = completion.ttft_s or time.monotonic() - start
                completion.chunks.append(text)
            completion.finish_reason = choice.finish_reason or completion.finish_reason
    completion.text = "".join(completion.chunks)
    completion.latency_s = time.monotonic() - start
    return completion


CALLS = {"grpc": generate_grpc, "http": generate_http, "openai": generate_openai}
"""How a user makes a request, by protocol: (url, model, prompt, params, stream, timeout_s) -> Completion."""


class Load:
    """`users` threads, each streaming requests one after another until stopped."""

    def __init__(self, server: TritonProcess, urls: dict[str, str], users: int, seed: int, prompts: list[str],
                 max_tokens: int, hang_s: float, t0: float) -> None:
        """`urls`: where each protocol's requests go (PROTOCOLS)."""
        self.server, self.prompts, self.max_tokens, self.hang_s, self.t0 = server, prompts, max_tokens, hang_s, t0
        self.urls = urls
        self.model = server.deployment.orchestrator_name
        self.results: list[RequestResult] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i, random.Random(seed * 1000 + i)), daemon=True,
                                         name=f"chaos-user-{i}") for i in range(users)]

    def _run(self, worker: int, rng: random.Random) -> None:
        for n in itertools.count(worker * 7):
            if self.stopping.is_set():
                return
            protocol, mode = rng.choice(PROTOCOLS), rng.choice(MODES)
            params = GenerationParams(max_tokens=self.max_tokens, speculation=mode, chat=True, return_perf_metrics=True)
            start = time.monotonic()
            completion, error = None, None
            try:
                completion = CALLS[protocol](self.urls[protocol], self.model, self.prompts[n % len(self.prompts)],
                                             params, stream=True, timeout_s=self.hang_s)
            except Exception as exc:  # every ending is classified, none dropped
                error = exc
            outcome, detail = classify(completion, error)
            result = RequestResult(worker, protocol, mode, start - self.t0, time.monotonic() - self.t0, outcome,
                                   detail, completion.num_output_tokens if completion else 0)
            with self.lock:
                self.results.append(result)
            if outcome != SERVED:
                self.stopping.wait(1.0)  # a dead server is not spun on (as the Locust users do)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> list[int]:
        """Stop after the requests under way; the workers still in one `hang_s` + 30 s later (stuck)."""
        self.stopping.set()
        deadline = time.monotonic() + self.hang_s + 30
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [i for i, t in enumerate(self.threads) if t.is_alive()]
