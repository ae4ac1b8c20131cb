"""The LLM batch gate against a model of Triton's dynamic batcher with one instance: a pass starts
as soon as the model is free and takes every call queued by then (the real thing runs in
tests/integration/test_load.py)."""

from __future__ import annotations

import asyncio

import pytest

from minions.batch_gate import BatchGate

PASS_S = 0.02  # one LLM pass
THINK_S = 0.001  # a request's own work between two calls (BLS response, next round)


class OneInstanceBatcher:
    """Triton's dynamic batcher, max_queue_delay 0, one model instance: records every pass's size."""

    def __init__(self) -> None:
        self.queue: list[asyncio.Future] = []
        self.passes: list[int] = []
        self.kick = asyncio.Event()
        self.worker = asyncio.ensure_future(self._serve())

    async def call(self) -> None:
        done = asyncio.get_running_loop().create_future()
        self.queue.append(done)
        self.kick.set()
        await done

    async def _serve(self) -> None:
        while True:
            await self.kick.wait()
            self.kick.clear()
            batch, self.queue = self.queue, []
            if not batch:
                continue
            self.passes.append(len(batch))
            await asyncio.sleep(PASS_S)
            for f in batch:
                f.set_result(None)
            self.kick.set()


async def plain_decoding(streams: int, steps: int, gate: BatchGate | None) -> list[int]:
    """`streams` requests of `steps` LLM calls each, started a little apart."""
    llm = OneInstanceBatcher()

    async def request(i: int) -> None:
        await asyncio.sleep(i * PASS_S / streams)
        for _ in range(steps):
            if gate is None:
                await llm.call()
            else:
                await gate.run(f"r{i}", llm.call)
            await asyncio.sleep(THINK_S)

    await asyncio.gather(*(request(i) for i in range(streams)))
    llm.worker.cancel()
    return llm.passes[steps // 2:]  # the steady state


def test_without_the_gate_the_batcher_splits_the_load_into_cohorts():
    """The failure the gate exists for, reproduced by the batcher model (mean batch 4 of 8)."""
    passes = asyncio.run(plain_decoding(8, 20, None))
    assert sum(passes) / len(passes) <= 5


def test_the_gate_merges_the_cohorts_into_whole_batches():
    gate = BatchGate(window_s=50 * THINK_S)  # generous: a loaded CI machine delays timers
    passes = asyncio.run(plain_decoding(8, 20, gate))
    assert sum(passes) / len(passes) >= 7.5, passes
    assert gate.in_flight == 0 and not gate.waiting


def test_a_lone_request_is_never_held():
    gate = BatchGate(window_s=50 * THINK_S)  # generous: a loaded CI machine delays timers
    passes = asyncio.run(plain_decoding(1, 10, gate))
    assert set(passes) == {1}
    assert gate.window_waits == 0 and gate.passes_released == 10


def test_a_request_that_does_not_come_back_costs_one_window_and_no_hang():
    """r0 leaves after its call (it goes drafting); r1's next call waits for r0 at most the window."""

    async def scenario() -> tuple[BatchGate, list[str]]:
        gate = BatchGate(window_s=0.05)
        order: list[str] = []

        async def call(name: str) -> None:
            order.append(name)
            await asyncio.sleep(0.001)

        await asyncio.gather(gate.run("r0", lambda: call("r0")), gate.run("r1", lambda: call("r1")))
        await asyncio.wait_for(gate.run("r1", lambda: call("r1 again")), timeout=1.0)
        return gate, order

    gate, order = asyncio.run(scenario())
    assert order == ["r0", "r1", "r1 again"]
    assert gate.window_waits == 1 and gate.in_flight == 0


@pytest.mark.parametrize("cancel_when", ["waiting", "released"])
def test_a_cancelled_call_gives_its_place_back(cancel_when):
    async def scenario() -> BatchGate:
        gate = BatchGate(window_s=0.0)
        started = asyncio.Event()
        finish = asyncio.Event()

        async def long_call() -> None:
            started.set()
            await finish.wait()

        first = asyncio.ensure_future(gate.run("a", long_call))
        await started.wait()
        second = asyncio.ensure_future(gate.run("b", lambda: asyncio.sleep(0)))  # held: a pass is in flight
        await asyncio.sleep(0)
        if cancel_when == "released":
            finish.set()
            await asyncio.sleep(0)  # `first` ends and releases `second`, which is cancelled before it starts
            second.cancel()
        else:
            second.cancel()
            finish.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        await asyncio.wait_for(gate.run("c", lambda: asyncio.sleep(0)), timeout=1.0)
        return gate

    gate = asyncio.run(scenario())
    assert gate.in_flight == 0 and not gate.waiting
