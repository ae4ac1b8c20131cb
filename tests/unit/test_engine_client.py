"""triton/engine_client.py: the gRPC message the orchestrator sends an engine model, and its answer;
a retired stream is closed once answered; a call its stream hears nothing for fails, and only that one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.tensors import build_engine_inputs, encode_engine_outputs, parse_engine_inputs
from minions.triton.engine_client import EngineCallError, TritonEngineClient, _decoded, _infer_request


def _arrays(message: service_pb2.ModelInferRequest) -> dict[str, np.ndarray]:
    dtypes = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64}
    return {t.name: np.frombuffer(raw, dtype=dtypes[t.datatype]).reshape(list(t.shape))
            for t, raw in zip(message.inputs, message.raw_input_contents, strict=True)}


def test_a_draft_verification_crosses_grpc_as_the_tensors_the_engine_parses():
    request = EngineRequest("r-1", [5, 6, 7], 4, draft=[8, 9], return_generation_logits=True, streaming=True)
    message = _infer_request("llm", request, "r-1/7")
    assert message.model_name == "llm" and message.id == "r-1/7"
    assert message.parameters["sequence_id"].string_param == "r-1"  # the engine's cache key
    assert [o.name for o in message.outputs] == ["output_ids", "sequence_length", "generation_logits"]
    sent = _arrays(message)
    assert sent.keys() == build_engine_inputs(request).keys()
    [parsed] = parse_engine_inputs(sent, "r-1")
    assert (parsed.input_ids, parsed.draft, parsed.streaming) == ([5, 6, 7], [8, 9], True)


def test_an_engines_answer_decodes_to_its_new_tokens():
    request = EngineRequest("r-2", [5, 6, 7], 3, exclude_input_in_output=True)
    outputs = encode_engine_outputs([request], [EngineResult([11, 12, 13])])
    response = service_pb2.ModelInferResponse(model_name="llm", id="r-2")
    for name, array in outputs.items():
        if name not in ("output_ids", "sequence_length"):
            continue
        tensor = response.outputs.add(name=name, datatype="INT32")
        tensor.shape.extend(array.shape)
        response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    assert _decoded(request, response).tokens == [11, 12, 13]



def test_a_streamed_stretch_asks_our_engines_and_not_tensorrt_llm_for_its_stream_interval():
    from minions.decoding.engine_call import STREAM_INTERVAL_PARAMETER

    request = EngineRequest("r-3", [5, 6], 16, streaming=True, stream_interval_s=0.1)
    assert _infer_request("llm", request, "r-3/1").parameters[STREAM_INTERVAL_PARAMETER].int64_param == 100
    assert STREAM_INTERVAL_PARAMETER not in _infer_request("llm", request, "r-3/1", native=True).parameters
    unstreamed = EngineRequest("r-3", [5, 6], 4, stream_interval_s=0.1)
    assert STREAM_INTERVAL_PARAMETER not in _infer_request("llm", unstreamed, "r-3/2").parameters


class _AnsweringStream:
    """A ModelStreamInfer stream as Triton's: each request answered with an empty final response; notes
    when the client half-closes it (its request iterator ends)."""

    def __init__(self, requests, silent_to: str) -> None:
        self.requests = requests
        self.silent_to = silent_to
        self.half_closed = False

    async def __aiter__(self):
        async for message in self.requests:
            if message.id.startswith(self.silent_to):
                continue
            response = service_pb2.ModelStreamInferResponse()
            response.infer_response.id = message.id
            response.infer_response.parameters["triton_final_response"].bool_param = True
            yield response
        self.half_closed = True


class _Service:
    """Opens `_AnsweringStream`s that never answer the calls of sequence `silent_to` (a stuck engine's)."""

    def __init__(self, silent_to: str = "stuck/") -> None:
        self.silent_to = silent_to
        self.streams: list[_AnsweringStream] = []

    def ModelStreamInfer(self, requests) -> _AnsweringStream:
        self.streams.append(_AnsweringStream(requests, self.silent_to))
        return self.streams[-1]


def test_a_retired_stream_is_closed_once_answered_and_the_next_call_opens_another():
    """What lets Triton unload a reloaded model's old instance at once (ModelControl retires its stream)."""
    async def calls() -> None:
        client = TritonEngineClient("127.0.0.1:1", frozenset({"llm"}), stall_timeout_s=5)
        client._service = service = _Service()

        async def call(n: int) -> None:
            assert [r async for r in client.stream("llm", EngineRequest(f"s-{n}", [1, 2], 1, streaming=True))] == []

        await call(1)
        await call(2)
        assert len(service.streams) == 1, "calls share a stream"
        closing = list(client._open)
        client.retire_streams("llm")
        await asyncio.gather(*(stream._reader for stream in closing))
        assert service.streams[0].half_closed
        await call(3)
        assert len(service.streams) == 2 and not service.streams[1].half_closed

    asyncio.run(calls())


def test_a_call_its_stream_hears_nothing_from_fails_and_the_others_on_the_stream_go_on():
    """The stall timeout, watched per stream (SharedStream): the silent call's request gets an error
    instead of hanging; a call answered meanwhile on the same stream, and one after, are untouched."""
    async def calls() -> None:
        client = TritonEngineClient("127.0.0.1:1", frozenset({"llm"}), stall_timeout_s=0.5)
        client._service = service = _Service(silent_to="stuck/")

        async def call(sequence: str) -> list[EngineResult]:
            return [r async for r in client.stream("llm", EngineRequest(sequence, [1, 2], 1, streaming=True))]

        stuck = asyncio.ensure_future(call("stuck"))
        assert await call("live-1") == []
        with pytest.raises(EngineCallError, match="no response for"):
            await stuck
        assert await call("live-2") == []
        assert len(service.streams) == 1, "one silent call does not break the stream"

    asyncio.run(calls())
