"""One generation on the `minions` model over Triton's gRPC streaming endpoint, as an async iterator.

Each generation has a gRPC stream of its own, so leaving the iterator early (the HTTP client went
away) cancels that stream, and Triton cancels the request in the model. A failed request's error comes
in the stream as a message without a status, and its status is read from the message
(`stream_error_code`). Triton's `triton_grpc_error` header would send the status instead, but Triton
2.51 then ends the stream from the thread that completes the response, and the cancellation
notification that follows races with the release of the stream's state: a stream of invalid requests
sent so crashed tritonserver with SIGSEGV after about 1,700 requests (fixed upstream in Triton 25.04,
server PR #8078; docs/api.md). Input tensors take their datatypes from the served model's own config,
read once. With an OrphanWatch, a generation a dead `minions` stub left unanswered ends with UNAVAILABLE
(orphans.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

from minions.errors import INTERNAL_PREFIX, is_refusal
from minions.frontend.orphans import ORPHANED, OrphanWatch

NOT_SERVED = ("unknown model", "is not ready", "no available versions", "is not healthy")
"""Parts of Triton's own messages for a request to a model it does not serve now: unloaded, loading, or
its stub dead until it is loaded again (python_backend's `Stub process '<instance>' is not healthy.`)."""


LLM_PARAMETER = "llm_model_name"
"""The orchestrator's config parameter naming its LLM model (minions.settings.OrchestratorSettings)."""


class TritonError(RuntimeError):
    """Triton refused or failed a request; `code` is the gRPC status it ended the stream with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def stream_error_code(message: str) -> grpc.StatusCode:
    """The status of a failed request from its message: a refusal to retry later (minions.errors) or a
    model Triton does not serve now is UNAVAILABLE, a failure inside the server INTERNAL, anything
    else (the request's own fault, as the orchestrator or Triton found it) INVALID_ARGUMENT."""
    if is_refusal(message) or any(part in message for part in NOT_SERVED):
        return grpc.StatusCode.UNAVAILABLE
    if message.startswith(INTERNAL_PREFIX):
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True)
class ModelInputs:
    """The served model's inputs, by name: Triton datatype, and whether its dims are a list ([-1])."""

    datatypes: dict[str, str]
    lists: frozenset[str]

    @classmethod
    def of(cls, config: service_pb2.ModelConfigResponse) -> ModelInputs:
        from tritonclient.grpc import model_config_pb2

        names = model_config_pb2.DataType.Name
        inputs = config.config.input
        return cls({i.name: names(i.data_type).removeprefix("TYPE_").replace("STRING", "BYTES") for i in inputs},
                   frozenset(i.name for i in inputs if list(i.dims) == [-1] and i.name != "text_input"))

    def tensor(self, name: str, value: Any) -> tuple[service_pb2.ModelInferRequest.InferInputTensor, bytes]:
        """One input as its gRPC tensor and raw contents, with the model's batch dimension of 1."""
        datatype = self.datatypes.get(name)
        if datatype is None:
            raise KeyError(f"the model has no input {name!r}")
        items = list(value) if name in self.lists else [value]
        if datatype == "BYTES":
            array = np.array([[v.encode("utf-8") if isinstance(v, str) else v for v in items]], dtype=np.object_)
            raw = serialize_byte_tensor(array).item() if array.size else b""
        else:
            array = np.array([items], dtype=triton_to_np_dtype(datatype))
            raw = array.tobytes()
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=array.shape)
        return tensor, raw


class TritonStream:
    """The `minions` model behind Triton's gRPC endpoint, one stream per generation."""

    def __init__(self, url: str, model: str, orphans: OrphanWatch | None = None) -> None:
        self.url = url
        self.model = model
        self.orphans = orphans
        self._service: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._model_config: service_pb2.ModelConfigResponse | None = None
        self._inputs: ModelInputs | None = None

    def service(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        """Made on first use, so that the channel belongs to the server's event loop."""
        if self._service is None:
            self._service = service_pb2_grpc.GRPCInferenceServiceStub(grpc.aio.insecure_channel(self.url))
        return self._service

    async def ready(self, model: str | None = None) -> bool:
        """Whether Triton says `model` (by default the served one) is ready."""
        try:
            answer = await self.service().ModelReady(service_pb2.ModelReadyRequest(name=model or self.model),
                                                     timeout=5)
        except grpc.aio.AioRpcError:
            return False
        return answer.ready

    async def _config(self) -> service_pb2.ModelConfigResponse:
        """The served model's config, read once it is loaded."""
        if self._model_config is None:
            try:
                config = await self.service().ModelConfig(service_pb2.ModelConfigRequest(name=self.model), timeout=10)
            except grpc.aio.AioRpcError as exc:
                raise TritonError(exc.code(), exc.details() or str(exc.code())) from None
            self._model_config = config
        return self._model_config

    async def inputs(self) -> ModelInputs:
        if self._inputs is None:
            self._inputs = ModelInputs.of(await self._config())
        return self._inputs

    async def llm_model(self) -> str:
        """The LLM model the orchestrator sends requests to (its config's `llm_model_name`)."""
        return (await self._config()).config.parameters[LLM_PARAMETER].string_value

    async def generate(self, inputs: Mapping[str, Any], request_id: str) -> AsyncIterator[dict[str, Any]]:
        """Each response's outputs (name -> value: a str, number or list) until the final one.
        Raises TritonError for a request Triton or the model refused or failed."""
        message = await self._message(inputs, request_id)
        sent = asyncio.Event()

        async def requests():
            yield message
            await sent.wait()  # keep our side open: closing it early would end the stream

        call = self.service().ModelStreamInfer(requests())
        watched = self.orphans.watch(call.cancel) if self.orphans is not None else None
        finished = False
        try:
            async for response in call:
                if watched is not None:
                    self.orphans.heard(watched)
                if response.error_message:  # the request failed: its one and last response
                    finished = True
                    raise TritonError(stream_error_code(response.error_message), response.error_message)
                answer = response.infer_response
                finished = answer.parameters["triton_final_response"].bool_param
                if answer.outputs:
                    yield _outputs(answer)
                if finished:
                    return
            raise TritonError(grpc.StatusCode.UNAVAILABLE, "the stream ended before the final response")
        except grpc.aio.AioRpcError as exc:
            finished = True  # the stream is over already
            raise TritonError(exc.code(), exc.details() or str(exc.code())) from None
        except asyncio.CancelledError:
            # The watch cancelled the call (an orphan), unless this task itself is being cancelled.
            if watched is None or not watched.orphaned or asyncio.current_task().cancelling():
                raise
            finished = True
            raise TritonError(grpc.StatusCode.UNAVAILABLE, ORPHANED) from None
        finally:
            if watched is not None:
                self.orphans.forget(watched)
            sent.set()  # closes our side: the stream ends
            if not finished:  # left early: Triton cancels the request in the model
                call.cancel()

    async def _message(self, inputs: Mapping[str, Any], request_id: str) -> service_pb2.ModelInferRequest:
        spec = await self.inputs()
        message = service_pb2.ModelInferRequest(model_name=self.model, id=request_id)
        message.parameters["triton_enable_empty_final_response"].bool_param = True
        for name, value in inputs.items():
            tensor, raw = spec.tensor(name, value)
            message.inputs.append(tensor)
            message.raw_input_contents.append(raw)
        return message


def _outputs(answer: service_pb2.ModelInferResponse) -> dict[str, Any]:
    result = InferResult(answer)
    out: dict[str, Any] = {}
    for tensor in answer.outputs:
        values = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v.item()
                  for v in np.asarray(result.as_numpy(tensor.name)).reshape(-1)]
        out[tensor.name] = values[0] if len(values) == 1 else values
    return out
