"""The one gRPC stream the orchestrator keeps to each decoupled engine model: every call to the model
goes over it as a message, its responses routed back by call (TritonEngineClient.stream)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

log = logging.getLogger("minions.engines")


STREAM_MAX_AGE_S = 10.0
"""A shared stream takes new calls for this long; then the next call opens a new one, and the old one
closes once its calls are answered. Triton 2.51 keeps a model's instance loaded while a gRPC stream
that sent it requests stays open: without this, a reloaded engine model's old instance (its weights
and KV cache) lived on until the orchestrator itself was unloaded (docs/operations.md). ModelControl
retires a reloaded model's stream at its next poll (`TritonEngineClient.retire_streams`); this bounds
what a poll misses."""


class Silent:
    """Queued for a call its stream heard nothing from for the stall timeout (`SharedStream._watch`)."""


class SharedStream:
    """One ModelStreamInfer stream to a decoupled engine model, shared by every call to it for
    STREAM_MAX_AGE_S: a call costs a message each way rather than a new HTTP/2 stream. Responses are
    routed by their Triton request id (a call's own: `TritonEngineClient._infer_request`); those of a
    call given up on are dropped. A broken stream fails every call waiting on it, and the next call
    opens a new one; so does the next call after the stream retired (`retire`).

    A call that hears nothing for `stall_timeout_s` (none of its responses waiting to be read) gets
    `Silent`. One timer per stream watches every call, moved on only when it fires, instead of a
    timeout entered for every response: a timer made and cancelled per token showed in the
    orchestrator's profile at many streams (docs/benchmarks.md)."""

    def __init__(self, stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str,
                 on_closed: Callable[[SharedStream], None], *, stall_timeout_s: float) -> None:
        self.model = model
        self._on_closed = on_closed
        self.broken: Exception | None = None
        self.retiring = False
        """It takes no new calls, and closes once the calls it carries are answered."""
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._waiting: dict[str, asyncio.Queue] = {}
        self._heard: dict[str, float] = {}
        """When each waiting call was opened or last got a response (the loop's clock)."""
        self.stall_timeout_s = stall_timeout_s
        self._watching: asyncio.TimerHandle | None = None
        self._call = stub.ModelStreamInfer(self._requests())
        self._loop = asyncio.get_running_loop()
        self._reader = self._loop.create_task(self._read())
        self._loop.call_later(STREAM_MAX_AGE_S, self.retire)

    def retire(self) -> None:
        """Take no new calls; close the stream once those it carries are answered."""
        self.retiring = True
        self._close_if_idle()

    def fail(self, failure: Exception) -> None:
        """End every waiting call with `failure`; the next call opens a new stream. This one is left
        open, not cancelled: cancelling requests held by a dead stub aborted tritonserver 2.51
        (boost::interprocess::lock_exception in the Python backend) in one test run of two."""
        self.broken = failure
        for responses in self._waiting.values():
            responses.put_nowait(failure)
        self._waiting.clear()
        self._heard.clear()

    def open(self, message: service_pb2.ModelInferRequest) -> asyncio.Queue:
        """Send `message`; its responses (or the stream's failure) arrive in the queue returned."""
        responses: asyncio.Queue = asyncio.Queue()
        if self.broken:
            responses.put_nowait(self.broken)
            return responses
        self._waiting[message.id] = responses
        self._heard[message.id] = self._loop.time()
        if self._watching is None:
            self._watching = self._loop.call_later(self.stall_timeout_s, self._watch)
        self._outgoing.put_nowait(message)
        return responses

    def forget(self, call_id: str) -> None:
        self._waiting.pop(call_id, None)
        self._heard.pop(call_id, None)
        self._close_if_idle()

    def _watch(self) -> None:
        """Give `Silent` to each call silent for the stall timeout; look again when the next could be."""
        now, self._watching = self._loop.time(), None
        for call_id, heard in list(self._heard.items()):
            if not self._waiting[call_id].empty():  # answered, not read yet: the reader is slow, not the engine
                self._heard[call_id] = now
            elif now - heard >= self.stall_timeout_s:
                self._waiting[call_id].put_nowait(Silent())
                del self._heard[call_id]
        if self._heard:
            due = min(self._heard.values()) + self.stall_timeout_s
            self._watching = self._loop.call_at(max(due, now + 0.001), self._watch)

    def _close_if_idle(self) -> None:
        if self.retiring and not self._waiting:
            self._outgoing.put_nowait(_END_OF_CALLS)

    async def _requests(self):
        while (message := await self._outgoing.get()) is not _END_OF_CALLS:
            yield message

    async def _read(self) -> None:
        try:
            async for response in self._call:
                if (responses := self._waiting.get(call_id := response.infer_response.id)) is not None:
                    responses.put_nowait(response)
                    if call_id in self._heard:
                        self._heard[call_id] = self._loop.time()
                elif response.error_message:
                    log.error("%s: error for no waiting call (%r): %s", self.model, call_id, response.error_message)
            failure: Exception = ConnectionError("the server closed the stream")
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            failure = ConnectionError(f"{type(exc).__name__}: {exc}")
        self._on_closed(self)
        if self.broken is not None or self.retiring and not self._waiting:  # failed or closed by us
            self.broken = self.broken or failure
            return
        self.broken = failure
        log.warning("%s: the gRPC stream to the engine model ended (%s)", self.model, failure)
        for responses in self._waiting.values():
            responses.put_nowait(failure)


_END_OF_CALLS = object()
"""Queued after a retired stream's last call: its request iterator ends, which half-closes the stream."""
