"""EngineClient over Triton's own gRPC endpoint: how the orchestrator reaches the llm and ssm_* models.

The orchestrator calls the engine models as any Triton client would, through tritonserver's gRPC
port on loopback (`engine_grpc_url`), not through Python-backend BLS. Triton 2.51's Python backend
builds each BLS response's numpy arrays, and frees them, on stub threads that do not hold the GIL
(pb_tensor.cc, reached from InferRequest::Exec and ProcessBLSResponseDecoupled): with many streams
decoding at once, the `minions` stub crashed within minutes (heap corruption; docs/engines.md). Over
gRPC every array is made by Python code on the event loop and no thread pool is needed.

Every call has a Triton request id of its own; the sequence it continues (the engine's cache key)
travels as the request's correlation id, as for Triton's sequence models.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype

from minions.decoding.engine_call import (KEEP_SEQUENCE_PARAMETER, STREAM_INTERVAL_PARAMETER, EngineRequest,
                                          EngineResult)
from minions.engines.tensors import build_engine_inputs, decode_engine_outputs
from minions.errors import ModelUnavailable

from .engine_stream import SharedStream, Silent

log = logging.getLogger("minions.engines")


class EngineCallError(RuntimeError):
    """An engine model answered with an error (or not at all)."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(f"engine model {model!r} failed: {message}")
        self.model = model


class TritonEngineClient:
    def __init__(self, url: str, decoupled_models: frozenset[str], stall_timeout_s: float,
                 native_models: frozenset[str] = frozenset()) -> None:
        self.url = url
        # Decoupled engine models (in-flight batching) answer over a gRPC stream, as to a client of
        # TensorRT-LLM's decoupled tensorrt_llm model.
        self.decoupled_models = decoupled_models
        # TensorRT-LLM's own tensorrt_llm models (settings.trtllm_model_names).
        self.native_models = native_models
        self.stall_timeout_s = stall_timeout_s
        """A call (or a stream between two responses) silent this long fails: its request gets an error
        instead of hanging (settings.py, engine_stall_timeout_s)."""
        self._service: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._streams: dict[str, SharedStream] = {}
        self._open: set[SharedStream] = set()
        """Every stream not closed yet, the retiring ones included (`fail_model` ends them all)."""
        self._calls = itertools.count()

    def service(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        """Triton's gRPC service, made on first use so that the channel belongs to the event loop that runs
        the requests."""
        if self._service is None:
            channel = grpc.aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
            self._service = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return self._service

    def _stream_to(self, model: str) -> SharedStream:
        stream = self._streams.get(model)
        if stream is None or stream.broken or stream.retiring:
            stream = self._streams[model] = SharedStream(self.service(), model, self._open.discard,
                                                          stall_timeout_s=self.stall_timeout_s)
            self._open.add(stream)
        return stream

    def retire_streams(self, model: str) -> None:
        """Let `model`'s stream close once the calls it carries are answered; the next call opens a new
        one. ModelControl calls it when the model was loaded again or is not ready: Triton 2.51 keeps an
        instance loaded while a stream that called it is open, so the old instance (its weights and KV
        cache) then goes with its last answer rather than up to STREAM_MAX_AGE_S later."""
        if (stream := self._streams.pop(model, None)) is not None:
            stream.retire()

    def fail_model(self, model: str, failure: ModelUnavailable) -> None:
        """End every call waiting on `model` at once with `failure` (its stub died: they would wait for
        the stall timeout); later calls go over a new stream."""
        for stream in [s for s in self._open if s.model == model]:
            stream.fail(failure)

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        """One call, one result."""
        if model in self.decoupled_models:
            results = [r async for r in self.stream(model, request)]
            if len(results) != 1:
                raise EngineCallError(model, f"expected one response from a decoupled engine model, got {len(results)}")
            return results[0]
        message = self._infer_request(model, request)
        try:
            response = await self._within_timeout(model, self.service().ModelInfer(message))
        except grpc.aio.AioRpcError as exc:
            raise EngineCallError(model, exc.details() or str(exc.code())) from None
        return _decoded(request, response)

    async def stream(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        """A decoupled engine's responses to one call, a result each (one per token when the call
        streams), until the one that carries Triton's final flag. Leaving early sends a `stop` for the
        sequence, which ends its generation at the next step."""
        if model not in self.decoupled_models:
            raise EngineCallError(model, "only a decoupled (in-flight) engine model streams")
        message = self._infer_request(model, request)
        message.parameters["triton_enable_empty_final_response"].bool_param = True
        stream = self._stream_to(model)
        responses = stream.open(message)
        finished = False
        try:
            while True:
                response = await responses.get()
                if isinstance(response, ModelUnavailable):
                    raise response
                if isinstance(response, Silent):
                    raise self._stalled(model)
                if isinstance(response, Exception):
                    raise EngineCallError(model, f"the gRPC stream broke: {response}")
                if response.error_message:
                    raise EngineCallError(model, response.error_message)
                answer = response.infer_response
                finished = answer.parameters["triton_final_response"].bool_param
                if answer.outputs:
                    yield _decoded(request, answer)
                if finished:
                    return
        finally:
            stream.forget(message.id)
            if not finished and not request.stop:  # left (or gave up) early: end the generation
                await self.release(model, request.request_id)

    async def release(self, model: str, request_id: str) -> None:
        """Tell an engine the sequence is over (tensorrt_llm's `stop`), so it frees the cached state.
        TensorRT-LLM's own models keep no sequence between calls (their KV blocks are reused by content):
        they get nothing. A call left early there runs out its few remaining tokens (at most a plain
        stretch or a draft), its responses dropped: stopping it would take a second request under the
        same id, whose responses the shared stream could not tell apart."""
        await self._stop(model, EngineRequest.release(request_id), "release")

    async def interrupt(self, model: str, request_id: str) -> None:
        """End the sequence's running stream before its next step, keeping its state in the engine (our
        engines only: a TensorRT-LLM stream runs to its end)."""
        await self._stop(model, EngineRequest.interrupt(request_id), "interrupt")

    async def _stop(self, model: str, stop: EngineRequest, what: str) -> None:
        """Send a `stop` call, best effort: a release that fails leaves the slot to LRU eviction, an
        interrupt that fails lets the stream run to its end (slower, never wrong)."""
        if model in self.native_models:
            return
        try:
            await self.generate(model, stop)
        except Exception as exc:
            log.warning("could not %s %s in %s: %s", what, stop.request_id, model, exc)

    def _infer_request(self, model: str, request: EngineRequest) -> service_pb2.ModelInferRequest:
        """The call's message, with a Triton request id of its own (the sequence travels as the correlation id)."""
        return _infer_request(model, request, f"{request.request_id}/{next(self._calls)}", model in self.native_models)

    async def _within_timeout(self, model: str, awaitable):
        """A unary call's answer, or EngineCallError once it is silent for the stall timeout (a stream's
        calls are watched by their stream: `SharedStream`)."""
        try:  # asyncio.timeout: 3.11's wait_for can drop a cancellation (drafters.ask_one says how)
            async with asyncio.timeout(self.stall_timeout_s):
                return await awaitable
        except TimeoutError:
            raise self._stalled(model) from None

    def _stalled(self, model: str) -> EngineCallError:
        """The error for a call `model` left silent for the stall timeout, logged as it is made."""
        log.error("engine model %s did not answer for %.0f s", model, self.stall_timeout_s)
        return EngineCallError(model, f"no response for {self.stall_timeout_s:.0f} s")


CHANNEL_OPTIONS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]
"""Generation logits (vocabulary x draft rows, float32) exceed gRPC's default 4 MB message limit."""


def _infer_request(model: str, request: EngineRequest, call_id: str, native: bool = False
                   ) -> service_pb2.ModelInferRequest:
    """The KServe v2 gRPC message for one call of `request`: tensorrt_llm's input tensors as raw
    contents (`native`: for TensorRT-LLM's own model), the call's own id, and its sequence as the
    correlation id (`sequence_id`)."""
    message = service_pb2.ModelInferRequest(model_name=model, id=call_id)
    message.parameters["sequence_id"].string_param = request.request_id
    if request.streaming and request.stream_interval_s > 0 and not native:
        message.parameters[STREAM_INTERVAL_PARAMETER].int64_param = round(1000 * request.stream_interval_s)
    if request.keep_sequence and not native:
        message.parameters[KEEP_SEQUENCE_PARAMETER].bool_param = True
    for name, array in build_engine_inputs(request, native).items():
        tensor = message.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype))
        tensor.shape.extend(array.shape)
        message.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in (["output_ids", "sequence_length"] + (["output_log_probs"] if request.return_log_probs else [])
                 + (["generation_logits"] if request.return_generation_logits else [])
                 + (["num_cached_tokens"] if request.return_perf_metrics and not native else [])):
        message.outputs.add(name=name)
    return message


def _decoded(request: EngineRequest, response: service_pb2.ModelInferResponse) -> EngineResult:
    result = InferResult(response)
    return decode_engine_outputs(request, {o.name: result.as_numpy(o.name) for o in response.outputs})
