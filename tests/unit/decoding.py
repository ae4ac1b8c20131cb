"""Driving the decode loop in process, for the loop's unit tests (fixtures in conftest.py).

InProcessClient is the tests' EngineClient: it moves every call through the same tensor interface
the Triton BLS uses (build_engine_inputs -> parse_engine_inputs -> engine -> encode_engine_outputs,
then the outputs decoded as minions.triton.engine_client does), and releases with a `stop` request.
The engines behind it are real: TorchEngine and NgramEngine. Tests synchronise with it on what it has
seen (`until`: a call started, a release done), never on sleeps, and bound every wait (`within`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import pytest

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.tensors import (
    CallTimes,
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
from minions.settings import DEFAULTS, OrchestratorSettings
from minions.speculation.services import Services

PROMPTS = [[3, 7, 1, 9, 4], [0, 0, 5], [12, 2, 8, 8, 1, 6, 15, 12, 2]]
REQUEST_FIELDS = {f.name for f in dataclasses.fields(DecodeRequest)}


class InProcessClient:
    """EngineClient over in-process engines, speaking the tensorrt_llm tensor interface."""

    def __init__(self, engines: dict) -> None:
        self.engines = engines
        self.calls: list[tuple[str, EngineRequest]] = []
        self.released: list[tuple[str, str]] = []
        """(model, request id) of every release begun."""
        self.release_done: list[tuple[str, str]] = []
        """(model, request id) of every release the engine has carried out."""
        self._watchers: list[tuple[Callable[[InProcessClient], bool], asyncio.Future]] = []

    def until(self, condition: Callable[[InProcessClient], bool]) -> asyncio.Future:
        """A future that resolves once `condition(self)` holds: checked now and whenever a call starts or
        a release is done (or a subclass calls `notify`). Await it through `within`, which bounds the wait."""
        future = asyncio.get_running_loop().create_future()
        self._watchers.append((condition, future))
        self.notify()
        return future

    def notify(self) -> None:
        """Resolve the futures of `until` whose condition now holds."""
        waiting = []
        for condition, future in self._watchers:
            if future.done():
                continue
            if condition(self):
                future.set_result(None)
            else:
                waiting.append((condition, future))
        self._watchers = waiting

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        # Snapshot: the loop passes its live sequence list as input_ids and extends it afterwards.
        self.calls.append((model, dataclasses.replace(request, input_ids=list(request.input_ids))))
        self.notify()
        tensors = build_engine_inputs(request)
        requests = parse_engine_inputs(tensors, request.request_id)
        engine = self.engines[model]
        results = [engine.generate(r) for r in requests]
        now = time.time_ns()  # the perf outputs' times (a request's first call asks for its cached tokens)
        outputs = encode_engine_outputs(requests, results, CallTimes(now, now, now))
        await asyncio.sleep(0)  # a real transport yields to the event loop
        return decode_engine_outputs(request, outputs)

    async def stream(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        """An in-flight engine's streaming generation, answered from its thread into a queue."""
        self.calls.append((model, dataclasses.replace(request, input_ids=list(request.input_ids))))
        self.notify()
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
        self.release_done.append((model, request_id))
        self.notify()

    async def interrupt(self, model: str, request_id: str) -> None:
        """As the engine model reads it: the interrupt's flag travels as a request parameter, not a tensor."""
        request = EngineRequest.interrupt(request_id)
        self.calls.append((model, request))
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        self.engines[model].submit([(request, lambda value: loop.call_soon_threadsafe(done.set_result, value))])
        await done


class HungClient(InProcessClient):
    """An SSM that never answers a draft (a stalled stub); releasing it still works. `waiting`: the
    draft calls hanging now (wait for one with `until`)."""

    def __init__(self, engines: dict, hung: str) -> None:
        super().__init__(engines)
        self.hung = hung
        self.waiting = 0

    async def generate(self, model: str, request):
        if model == self.hung and not request.stop:
            self.waiting += 1
            self.notify()
            try:
                await asyncio.Event().wait()
            finally:
                self.waiting -= 1
        return await super().generate(model, request)


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
        return services_with(self.request.speculation.ssms, **self.service_args)


SETTINGS_KEYS = frozenset(OrchestratorSettings.flat_fields())


def services_with(ssms: tuple[str, ...], **kwargs) -> Services:
    """Services over `ssms`: keyword arguments that name a deployment setting by its deploy.yaml key
    (`probe_min_gap`) set it (DEFAULTS' otherwise), the others go to Services itself."""
    settings = {k: kwargs.pop(k) for k in list(kwargs) if k in SETTINGS_KEYS}
    return Services(ssms=ssms, settings=DEFAULTS.with_keys(**settings), **kwargs)


TEST_REQUEST = {"num_draft_tokens": 4, "use_draft_logits": False, "pipeline": False, "stream_interval_s": 0.0}
"""How the tests' requests speculate unless they say otherwise: a fixed length, no pipeline, and a
streaming LLM's every token in a response of its own."""


def make_plan(prompt, n, speculation: Speculation = OFF, **kwargs) -> Plan:
    """DecodeRequest fields from kwargs go to the request (TEST_REQUEST's unless given), the rest to the services."""
    request_args = TEST_REQUEST | {k: v for k, v in kwargs.items() if k in REQUEST_FIELDS}
    service_args = {k: v for k, v in kwargs.items() if k not in REQUEST_FIELDS}
    return Plan(DecodeRequest(prompt_ids=list(prompt), max_new_tokens=n, speculation=speculation, **request_args),
                service_args)


def rounds_of(client, p: Plan, request_id: str = "req"):
    """The loop's round generator for a plan (close it, e.g. with aclosing, to stop early)."""
    return speculative_decode(client, p.request, p.services(), request_id)


async def within(awaitable, seconds: float, what: str):
    """`awaitable`'s result; the test fails, saying that `what` did not happen, if it takes over
    `seconds` (a guard against a hang, generous: no test asserts on how long anything took)."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        pytest.fail(f"{what}: not within {seconds} s (hung?)")


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
