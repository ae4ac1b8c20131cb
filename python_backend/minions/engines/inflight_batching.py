"""In-flight (iteration-level) batching: a request joins the running batch at its next decode step.

Why: a draft of s tokens is s decode steps. With Triton's dynamic batching alone, a batch runs until its
longest draft is done, and a request that arrives one step later waits for all of it. Under load the
drafter then served small batches one after another (mean 2.5 at 8 streams) although most requests
were drafting at the same time. Here one thread steps every sequence that has work, and takes in new
work before every step, as TensorRT-LLM's in-flight batching does.

The rules the scheduler keeps (the `Stepper` does the arithmetic):
- calls for one request id run one after another, in the order they were submitted (a pipelined early
  draft and the regular draft that replaced it): each sees the state the one before left;
- a `stop` call releases the id's state after its earlier calls, never during one; a streaming call
  of that id running when the stop arrives is ended before the next step (it keeps what it has made);
  an interrupt (`stop` with `keep_sequence`) ends it so and keeps the state for the id's next call;
- a call that `ends_sequence` (a whole request) releases its id's state as it is answered, before the
  id's next call starts;
- a streaming call's new tokens are answered after a step (partial results), then its final one: its
  first token at once, later ones at most every `stream_interval_s` of its request (0: after every
  step), so that a fast engine's tokens cross the processes between it and the client a few at a time,
  as TensorRT-LLM's and vLLM's `stream_interval` coalesce them;
- at most `capacity` sequences step at once; more wait for a place, in order;
- a step that fails fails the sequences in it (their state is dropped, not kept) and no others;
- a cancelled call (its client has gone) ends before the next step with RequestCancelled: a running
  one releases its id's state (kept as a prefix where the engine caches them), a waiting one never
  starts; a call answered before its cancellation is taken in is left as it was;
- every submitted call gets exactly one final answer: its result or its exception.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.api import Answer
from minions.errors import RequestCancelled

log = logging.getLogger(__name__)

Job = TypeVar("Job")


class Stepper(Protocol[Job]):
    """What an engine provides: start a call, step calls together, read a finished one's result."""

    def start(self, request: EngineRequest) -> Job:
        """Prepare a call (its slot, the tokens to evaluate); raises for a request it cannot serve."""
        ...

    def step(self, jobs: list[Job]) -> list[bool]:
        """One decode step for every job; which of them are finished."""
        ...

    def partial(self, job: Job) -> EngineResult | None:
        """A streaming job's tokens made since the last call (`final` false); None when there are none."""
        ...

    def result(self, job: Job) -> EngineResult: ...

    def release(self, request_id: str) -> None:
        """The id is done (after its last call): its state may be kept for later requests to reuse."""
        ...

    def drop(self, request_id: str) -> None:
        """Forget the id's state, which a failed step left unknown."""
        ...


@dataclass
class _Call:
    request: EngineRequest
    answer: Answer
    answered_at: float | None = None
    """When a partial result was last answered (monotonic s); None before the first."""


class InflightBatcher(Generic[Job]):
    """One thread that steps every call with work, taking in new calls before each step (the rules above)."""

    def __init__(self, stepper: Stepper[Job], capacity: int, name: str = "engine",
                 prepare: Callable[[], None] | None = None) -> None:
        """`prepare` runs on the batcher's thread before its first step, and the constructor waits for
        it (raising what it raised): an engine whose library keeps per-thread state (OpenMP's thread
        team in llama.cpp) warms up on the thread that will step it."""
        self.stepper = stepper
        self.capacity = capacity
        self._queue: list[_Call] = []
        self._cond = threading.Condition()
        self._closed = False
        self._stopping: set[str] = set()  # ids whose streaming call a waiting stop ends (batcher's thread only)
        self._cancelled: list[EngineRequest] = []  # submitted calls to end, by identity (under _cond)
        self._prepared = threading.Event()
        self._prepare_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(prepare,), name=f"{name}-inflight", daemon=True)
        self._thread.start()
        self._prepared.wait()
        if self._prepare_error is not None:
            raise self._prepare_error

    def submit(self, calls: list[tuple[EngineRequest, Answer]]) -> None:
        """Queue calls; each one's answer is called once, from the batcher's thread. Calls submitted
        together are taken in together, so they share their first step."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the in-flight batcher is closed")
            self._queue.extend(_Call(r, a) for r, a in calls)
            self._cond.notify()

    def cancel(self, requests: list[EngineRequest]) -> None:
        """End these submitted calls before the next step (their client has gone): each is answered
        with RequestCancelled unless it was answered already."""
        with self._cond:
            self._cancelled.extend(requests)
            self._cond.notify()

    def run(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]:
        """Submit requests together and wait for all their answers (in order); a streaming call's
        partial results are joined into its one result."""
        out: list[EngineResult | Exception | None] = [None] * len(requests)
        streamed: list[list[EngineResult]] = [[] for _ in requests]
        remaining = threading.Semaphore(0)

        def answer_for(i: int) -> Answer:
            def answer(value: EngineResult | Exception) -> None:
                if isinstance(value, EngineResult) and not value.final:
                    streamed[i].append(value)
                    return
                out[i] = joined([*streamed[i], value]) if streamed[i] and isinstance(value, EngineResult) else value
                remaining.release()
            return answer

        self.submit([(r, answer_for(i)) for i, r in enumerate(requests)])
        for _ in requests:
            remaining.acquire()
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """Stop taking calls; the thread finishes what it holds and exits."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    # -- the batcher's thread ----------------------------------------------------------------------
    def _run(self, prepare: Callable[[], None] | None) -> None:
        try:
            if prepare is not None:
                prepare()
        except BaseException as exc:  # re-raised by the constructor, on the caller's thread
            self._prepare_error = exc
            return
        finally:
            self._prepared.set()
        self._loop()

    def _loop(self) -> None:
        waiting: list[_Call] = []  # submitted, not started: held by an earlier call of their id or by capacity
        active: list[tuple[Job, _Call]] = []
        while True:
            with self._cond:
                while not self._queue and not active and not waiting and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue and not active and not waiting:
                    return
                waiting.extend(self._queue)
                self._queue.clear()
                cancelled, self._cancelled = self._cancelled, []
            if cancelled:
                waiting, active = self._end_cancelled(cancelled, waiting, active)
            # With nothing active, every waiting call starts or is answered, so this never spins.
            waiting = self._admit(waiting, active)
            if active:
                active = self._step(active)

    def _end_cancelled(self, cancelled: list[EngineRequest], waiting: list[_Call],
                       active: list[tuple[Job, _Call]]) -> tuple[list[_Call], list[tuple[Job, _Call]]]:
        """Answer the cancelled calls still held with RequestCancelled; a running one's id is released.
        Matched by identity: a request id may come again in a later call, which must not end."""
        ended = {id(request) for request in cancelled}
        still_waiting = []
        for call in waiting:
            if id(call.request) in ended:
                self._answer(call, RequestCancelled("its client has gone"))
            else:
                still_waiting.append(call)
        still_active = []
        for job, call in active:
            if id(call.request) in ended:
                self._answer(call, RequestCancelled("its client has gone"))
                self._release(call.request.request_id)
            else:
                still_active.append((job, call))
        return still_waiting, still_active

    def _admit(self, waiting: list[_Call], active: list[tuple[Job, _Call]]) -> list[_Call]:
        """Start what may start now; the rest keeps its order."""
        busy = {call.request.request_id for _, call in active}
        held: list[_Call] = []
        for call in waiting:
            request_id = call.request.request_id
            if request_id in busy:  # an earlier call of this id is running or still waits
                if call.request.stop:
                    self._stopping.add(request_id)
                held.append(call)
                continue
            busy.add(request_id)
            if call.request.stop:  # a release frees the sequence; an interrupt (its stream over) keeps it
                self._answer(call, EngineResult([]) if call.request.keep_sequence else self._release(request_id))
                busy.discard(request_id)
            elif len(active) >= self.capacity:
                held.append(call)
            else:
                try:
                    active.append((self.stepper.start(call.request), call))
                except Exception as exc:  # a request it cannot serve fails alone
                    self._answer(call, exc)
                    busy.discard(request_id)
        return held

    def _step(self, active: list[tuple[Job, _Call]]) -> list[tuple[Job, _Call]]:
        active = self._end_stopped_streams(active)
        if not active:
            return active
        try:
            done = self.stepper.step([job for job, _ in active])
        except Exception as exc:  # llama.cpp refusing a step fails the calls in it, not the model
            log.exception("decode step of %d sequences failed", len(active))
            for _, call in active:
                self._drop(call.request.request_id)  # what the slot holds is unknown now
                self._answer(call, exc)
            return []
        still = []
        now = time.monotonic()
        for (job, call), finished in zip(active, done):
            if finished:
                self._finish(job, call)
            else:
                if call.request.streaming and self._due(call, now):
                    partial = self.stepper.partial(job)
                    if partial is not None:
                        self._answer(call, partial)
                        call.answered_at = now
                still.append((job, call))
        return still

    def _due(self, call: _Call, now: float) -> bool:
        """Whether a streaming call's new tokens go out after this step."""
        return call.answered_at is None or now - call.answered_at >= call.request.stream_interval_s

    def _end_stopped_streams(self, active: list[tuple[Job, _Call]]) -> list[tuple[Job, _Call]]:
        """Finish the streaming calls whose id a stop is waiting for; the stop then releases the id."""
        still = []
        for job, call in active:
            if call.request.streaming and call.request.request_id in self._stopping:
                self._finish(job, call)
            else:
                still.append((job, call))
        self._stopping.clear()
        return still

    def _finish(self, job: Job, call: _Call) -> None:
        try:
            value: EngineResult | Exception = self.stepper.result(job)
        except Exception as exc:
            value = exc
        self._answer(call, value)
        if call.request.ends_sequence:  # here, before a next call of its id can start
            self._release(call.request.request_id)

    def _release(self, request_id: str) -> EngineResult | Exception:
        try:
            self.stepper.release(request_id)
        except Exception as exc:
            log.exception("releasing %s failed", request_id)
            return exc
        return EngineResult([])

    def _drop(self, request_id: str) -> None:
        try:
            self.stepper.drop(request_id)
        except Exception:
            log.exception("dropping %s failed", request_id)

    @staticmethod
    def _answer(call: _Call, value: EngineResult | Exception) -> None:
        try:
            call.answer(value)
        except Exception:  # a failing answer (a closed stream) must not stop the batcher
            log.exception("answering %s failed", call.request.request_id)


def joined(parts: list[EngineResult]) -> EngineResult:
    """A streamed call's partial results and final one as one result."""
    rows = [p.logits for p in parts if p.logits is not None]
    log_probs = [lp for p in parts for lp in p.log_probs] if all(p.log_probs is not None for p in parts) else None
    return EngineResult([t for p in parts for t in p.tokens], logits=np.concatenate(rows) if rows else None,
                        log_probs=log_probs, cached_tokens=parts[0].cached_tokens)
