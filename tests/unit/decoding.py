"""Driving the decode loop in process, for the loop's unit tests (fixtures in conftest.py).

InProcessClient is the tests' EngineClient: it moves every call through the same tensor interface
the Triton BLS uses (build_engine_inputs -> parse_engine_inputs -> engine -> encode_engine_outputs,
then the outputs decoded as minions.triton.engine_client does), and releases with a `stop` request.
The engines behind it are real: TorchEngine and NgramEngine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.tensors import (
    build_engine_inputs,
    decode_engine_outputs,
    encode_engine_outputs,
    parse_engine_inputs,
)
from minions.engines.torch_engine import TorchEngine
from minions.speculation.decode_request import DecodeRequest
from minions.speculation.loop import speculative_decode
from minions.speculation.mode import OFF, Speculation
from minions.speculation.rounds import DecodeStats, Round
from minions.speculation.services import Services

PROMPTS = [[3, 7, 1, 9, 4], [0, 0, 5], [12, 2, 8, 8, 1, 6, 15, 12, 2]]
REQUEST_FIELDS = {f.name for f in dataclasses.fields(DecodeRequest)}


class InProcessClient:
    """EngineClient over in-process engines, speaking the tensorrt_llm tensor interface."""

    def __init__(self, engines: dict) -> None:
        self.engines = engines
        self.calls: list[tuple[str, EngineRequest]] = []
        self.released: list[tuple[str, str]] = []

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        # Snapshot: the loop passes its live sequence list as input_ids and extends it afterwards.
        self.calls.append((model, dataclasses.replace(request, input_ids=list(request.input_ids))))
        tensors = build_engine_inputs(request)
        requests = parse_engine_inputs(tensors, request.request_id)
        engine = self.engines[model]
        results = [engine.generate(r) for r in requests]
        outputs = encode_engine_outputs(requests, results)
        await asyncio.sleep(0)  # a real transport yields to the event loop
        return decode_engine_outputs(request, outputs)

    async def stream(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        """An in-flight engine's streaming generation, answered from its thread into a queue."""
        self.calls.append((model, dataclasses.replace(request, input_ids=list(request.input_ids))))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self.engines[model].submit([(request, lambda value: loop.call_soon_threadsafe(queue.put_nowait, value))])
        finished = False
        try:
            while True:
                value = await queue.get()
                if isinstance(value, Exception):
                    raise value
                finished = value.final
                if value.tokens:
                    yield value
                if finished:
                    return
        finally:
            if not finished:  # left early: end the generation, as TritonEngineClient.stream does
                await self.release(model, request.request_id)

    async def release(self, model: str, request_id: str) -> None:
        self.released.append((model, request_id))
        await self.generate(model, EngineRequest.release(request_id))


class BrokenEngine:
    """An SSM whose drafting fails after `working_calls` calls, as a crashed stub or a timeout would."""

    def __init__(self, inner, working_calls: int) -> None:
        self.inner = inner
        self.working_calls = working_calls
        self.calls = 0

    def generate(self, request: EngineRequest) -> EngineResult:
        if request.stop:
            return self.inner.generate(request)
        self.calls += 1
        if self.calls > self.working_calls:
            raise RuntimeError("SSM stub is gone")
        return self.inner.generate(request)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)


@dataclass
class Plan:
    """A test's request and the services it decodes with: the objects passed in (health, weights,
    length_stats, pool...) are shared by every decode of the plan, the others made afresh for each."""

    request: DecodeRequest
    service_args: dict = field(default_factory=dict)

    def services(self) -> Services:
        return Services(ssms=self.request.speculation.ssms, **self.service_args)


def make_plan(prompt, n, speculation: Speculation = OFF, **kwargs) -> Plan:
    """DecodeRequest fields from kwargs go to the request, the rest to the services."""
    request_args = {k: v for k, v in kwargs.items() if k in REQUEST_FIELDS}
    service_args = {k: v for k, v in kwargs.items() if k not in REQUEST_FIELDS}
    return Plan(DecodeRequest(prompt_ids=list(prompt), max_new_tokens=n, speculation=speculation, **request_args),
                service_args)


def rounds_of(client, p: Plan, request_id: str = "req"):
    """The loop's round generator for a plan (close it, e.g. with aclosing, to stop early)."""
    return speculative_decode(client, p.request, p.services(), request_id)


async def collect(client, p: Plan, request_id: str = "req") -> list[Round]:
    async with aclosing(rounds_of(client, p, request_id)) as rounds:
        return [r async for r in rounds]


def decode(client, p: Plan, request_id: str = "req") -> tuple[list[int], DecodeStats, list[Round]]:
    rounds = asyncio.run(collect(client, p, request_id))
    stats = DecodeStats()
    for r in rounds:
        stats.add(r)
    return [t for r in rounds for t in r.tokens], stats, rounds


def assert_all_released(engines) -> None:
    for name, engine in engines.items():
        if isinstance(engine, TorchEngine):
            assert len(engine.cache) == 0, f"{name} still caches {list(engine.cache._entries)}"
