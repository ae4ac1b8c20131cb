"""The in-flight batcher's rules, against a stepper whose jobs take a known number of steps and which
records every step (the real llama.cpp stepper is exercised in test_llamacpp_batching)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.inflight_batching import InflightBatcher
from minions.errors import InvalidRequest


@dataclass
class Job:
    request: EngineRequest
    steps_left: int
    steps: int = 0
    streamed: int = 0


@dataclass
class RecordingStepper:
    """A job takes request_output_len steps; its result is [number of steps it took]."""

    events: list[tuple] = field(default_factory=list)
    steps: list[list[str]] = field(default_factory=list)
    on_step: Callable[[int], None] | None = None
    fail_when: str | None = None  # a step with this id in it raises

    def start(self, request: EngineRequest) -> Job:
        if request.request_output_len < 0:
            raise InvalidRequest("negative length")
        self.events.append(("start", request.request_id, request.input_ids[0]))
        return Job(request, request.request_output_len)

    def step(self, jobs: list[Job]) -> list[bool]:
        ids = [j.request.request_id for j in jobs]
        self.steps.append(ids)
        if self.on_step is not None:
            self.on_step(len(self.steps))
        if self.fail_when in ids:
            raise RuntimeError("decode failed")
        for j in jobs:
            j.steps += 1
            j.steps_left -= 1
        return [j.steps_left <= 0 for j in jobs]

    def result(self, job: Job) -> EngineResult:
        self.events.append(("done", job.request.request_id, job.request.input_ids[0]))
        return EngineResult([job.steps])

    def partial(self, job: Job) -> EngineResult | None:
        """A streaming job's steps since its last partial, one token each (the step's number)."""
        new = list(range(job.streamed + 1, job.steps + 1))
        job.streamed = job.steps
        return EngineResult(new, final=False) if new else None

    def release(self, request_id: str) -> None:
        self.events.append(("release", request_id))

    def drop(self, request_id: str) -> None:
        self.events.append(("drop", request_id))


def call(request_id: str, steps: int, tag: int = 0) -> EngineRequest:
    return EngineRequest(request_id, [tag], steps)


@pytest.fixture
def stepper():
    return RecordingStepper()


@pytest.fixture
def batcher(stepper):
    b = InflightBatcher(stepper, capacity=4)
    yield b
    b.close()


def test_a_call_arriving_mid_batch_joins_at_the_next_step(stepper, batcher):
    late: list[EngineResult | Exception] = []
    arrived = threading.Event()

    def submit_late(step: int) -> None:
        if step == 3:  # the long call has stepped 3 times
            batcher.submit([(call("late", 2), lambda r: (late.append(r), arrived.set()))])

    stepper.on_step = submit_late
    (long,) = batcher.run([call("long", 10)])
    assert arrived.wait(5)
    assert long.tokens == [10] and late[0].tokens == [2]
    assert stepper.steps[3:5] == [["long", "late"], ["long", "late"]]  # not after the long call's 10 steps
    assert len(stepper.steps) == 10


def test_calls_of_one_id_run_in_order_and_never_share_a_step(stepper, batcher):
    results = batcher.run([call("a", 3, tag=1), call("b", 2), call("a", 2, tag=2)])
    assert [r.tokens for r in results] == [[3], [2], [2]]
    assert all(step.count("a") <= 1 for step in stepper.steps)
    events = [e for e in stepper.events if e[1] == "a"]
    assert events == [("start", "a", 1), ("done", "a", 1), ("start", "a", 2), ("done", "a", 2)]


def test_a_stop_releases_after_the_id_s_earlier_call(stepper, batcher):
    results = batcher.run([call("a", 3), EngineRequest("a", [0], 0, stop=True), call("b", 1)])
    assert [r.tokens for r in results] == [[3], [], [1]]
    assert [e for e in stepper.events if e[1] == "a"] == [("start", "a", 0), ("done", "a", 0), ("release", "a")]


def test_a_whole_request_releases_its_id_as_it_is_answered_and_the_next_of_its_id_runs_whole(stepper, batcher):
    """Two whole streaming requests of one id (clients reuse ids): each is released as it is answered,
    before the next starts, so the release never meets the next one (it used to come after the answer,
    from the model, and end the next request's stream with what it had)."""
    first, second = (EngineRequest("x", [tag], 3, streaming=True, ends_sequence=True) for tag in (1, 2))
    results = batcher.run([first, second])
    assert [r.tokens for r in results] == [[1, 2, 3], [1, 2, 3]]
    assert [e for e in stepper.events if e[1] == "x"] == [
        ("start", "x", 1), ("done", "x", 1), ("release", "x"), ("start", "x", 2), ("done", "x", 2), ("release", "x")]


def test_a_cancelled_call_ends_before_the_next_step_and_releases_its_id(stepper, batcher):
    """A running call cancelled at step 3 steps no more, is answered RequestCancelled and its id is
    released; the call beside it runs on; a call of that id held behind it is cancelled unstarted."""
    running, held = call("gone", 100), call("gone", 5, tag=7)

    def cancel_at(step: int) -> None:
        if step == 3:
            batcher.cancel([running, held])

    stepper.on_step = cancel_at
    results = batcher.run([running, call("other", 6), held])
    assert [type(r).__name__ for r in results] == ["RequestCancelled", "EngineResult", "RequestCancelled"]
    assert results[1].tokens == [6]
    assert sum("gone" in step for step in stepper.steps) == 3
    assert [e for e in stepper.events if e[1] == "gone"] == [("start", "gone", 0), ("release", "gone")]


def test_a_cancellation_that_comes_after_the_answer_leaves_the_id_s_next_call_alone(stepper, batcher):
    """Cancellations match calls, not ids: a client that reuses a request id is not cancelled by the
    late cancellation of its earlier call."""
    (first,) = batcher.run([earlier := call("x", 2)])
    batcher.cancel([earlier])
    (second,) = batcher.run([call("x", 3)])
    assert first.tokens == [2] and second.tokens == [3]


def test_no_more_calls_step_at_once_than_the_capacity_and_all_are_answered(stepper):
    batcher = InflightBatcher(stepper, capacity=2)
    try:
        results = batcher.run([call(f"r{i}", 1 + i % 3) for i in range(7)])
    finally:
        batcher.close()
    assert [r.tokens for r in results] == [[1 + i % 3] for i in range(7)]
    assert max(len(s) for s in stepper.steps) == 2


def test_a_failing_step_fails_its_calls_only_and_the_batcher_goes_on(stepper, batcher):
    stepper.fail_when = "bad"
    results = batcher.run([call("good", 2), call("bad", 2)])
    assert all(isinstance(r, RuntimeError) for r in results)
    # Their state is dropped, not kept for reuse as a released sequence's is.
    assert ("drop", "good") in stepper.events and ("drop", "bad") in stepper.events
    assert not any(e[0] == "release" for e in stepper.events)
    stepper.fail_when = None
    assert batcher.run([call("good", 2)])[0].tokens == [2]


def test_a_call_that_cannot_start_fails_alone(stepper, batcher):
    results = batcher.run([call("x", -1), call("y", 1)])
    assert isinstance(results[0], InvalidRequest) and results[1].tokens == [1]


def test_an_answer_that_raises_does_not_stop_the_batcher(stepper, batcher):
    def broken(_: EngineResult | Exception) -> None:
        raise ConnectionError("stream closed")

    batcher.submit([(call("gone", 1), broken)])
    assert batcher.run([call("next", 1)])[0].tokens == [1]


def test_a_closed_batcher_refuses_calls(stepper):
    batcher = InflightBatcher(stepper, capacity=1)
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit([(call("late", 1), lambda r: None)])



@pytest.mark.parametrize(("interval_s", "parts"), [(0.0, [[1], [2], [3], [4], [5]]), (3600.0, [[1], [2, 3, 4, 5]])])
def test_a_stream_s_first_token_goes_out_at_once_and_later_ones_at_the_interval(interval_s, parts):
    """Every step's token at interval 0; with an interval longer than the call, its first token alone,
    then the rest with the final answer (which carries what was not streamed)."""

    class Streaming(RecordingStepper):
        def result(self, job: Job) -> EngineResult:
            rest = self.partial(job)
            return EngineResult(rest.tokens if rest else [])

    batcher = InflightBatcher(Streaming(), capacity=2)
    answers: list[EngineResult] = []
    finished = threading.Event()

    def answer(value: EngineResult | Exception) -> None:
        assert isinstance(value, EngineResult)
        answers.append(value)
        if value.final:
            finished.set()

    try:
        batcher.submit([(EngineRequest("s", [0], 5, streaming=True, stream_interval_s=interval_s), answer)])
        assert finished.wait(30)
    finally:
        batcher.close()
    assert [a.tokens for a in answers] == parts
    assert [a.final for a in answers] == [False] * (len(parts) - 1) + [True]


def test_prepare_runs_on_the_thread_that_steps_before_the_constructor_returns(stepper):
    """llama.cpp's OpenMP keeps a thread team per thread that starts parallel work: the warm-up must run
    on the stepping thread, and be done (the weights paged in) once the engine is built."""
    threads: dict[str, int] = {}
    stepper.on_step = lambda step: threads.setdefault("step", threading.get_ident())
    b = InflightBatcher(stepper, capacity=4, prepare=lambda: threads.setdefault("prepare", threading.get_ident()))
    try:
        assert "prepare" in threads and threads["prepare"] != threading.get_ident()
        b.run([call("a", 1)])
        assert threads["step"] == threads["prepare"]
    finally:
        b.close()


def test_a_prepare_that_fails_fails_the_constructor(stepper):
    def fail() -> None:
        raise OSError("no weights")

    with pytest.raises(OSError, match="no weights"):
        InflightBatcher(stepper, capacity=4, prepare=fail)
