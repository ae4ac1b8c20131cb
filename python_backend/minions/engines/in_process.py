"""An EngineClient that answers some models' calls with engine objects in the caller's own process.

The lookup drafters (prompt lookup, suffix matching) compute a draft in a fraction of a millisecond,
while a call to their Triton model costs a gRPC round trip through tritonserver and a Python stub, on
the cores the LLM decodes on (docs/benchmarks.md, "The lookups answered in the orchestrator's
process"). The orchestrator asks them on every probe of a plain stream and before every round that
drafts, so it can hold its own instances of them and answer those calls here; their Triton models
stay loaded for other clients and for the orchestrator's model control.
Every other call goes to `remote` unchanged.

A call is answered as the engine model's `execute` answers it (`generate` for every call, `stop`
included; `release` at a sequence's end), synchronously on the caller's event loop: the work is
shorter than a context switch to a thread would cost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from minions.decoding.engine_call import EngineClient, EngineRequest, EngineResult
from minions.engines.api import Engine


class InProcessEngines:
    """`engines` by model name answer here; every other model's calls go to `remote`."""

    def __init__(self, remote: EngineClient, engines: Mapping[str, Engine]) -> None:
        self.remote = remote
        self.engines = dict(engines)

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        engine = self.engines.get(model)
        if engine is None:
            return await self.remote.generate(model, request)
        return engine.generate(request)

    def stream(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        """A remote model's own stream (not wrapped: closing it early still ends its generation at
        once); an in-process engine's one result (it answers a call whole)."""
        if model not in self.engines:
            return self.remote.stream(model, request)
        return self._whole(model, request)

    async def _whole(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        yield await self.generate(model, request)

    async def release(self, model: str, request_id: str) -> None:
        engine = self.engines.get(model)
        if engine is None:
            await self.remote.release(model, request_id)
        else:
            engine.release(request_id)

    async def interrupt(self, model: str, request_id: str) -> None:
        """A remote model's running stream ended; an in-process engine runs no call to end."""
        if model not in self.engines:
            await self.remote.interrupt(model, request_id)
