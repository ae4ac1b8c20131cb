"""EngineClient over Triton BLS calls: how the orchestrator reaches the llm and ssm_* models."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from minions.engines.api import EngineRequest, EngineResult
from minions.engines.tensors import build_engine_inputs, decode_engine_outputs

log = logging.getLogger("minions.bls")


class EngineCallError(RuntimeError):
    """An engine model answered with an error (or not at all)."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(f"engine model {model!r} failed: {message}")
        self.model = model


class TritonEngineClient:
    def __init__(self, decoupled_models: frozenset[str], stall_timeout_s: float) -> None:
        # Decoupled engine models (in-flight batching) answer through a response iterator, as
        # tensorrtllm_backend's BLS calls its decoupled tensorrt_llm model.
        self.decoupled_models = decoupled_models
        self.stall_timeout_s = stall_timeout_s
        """A call (or a stream between two responses) silent this long fails: its request gets an error
        instead of hanging (settings.py, engine_stall_timeout_s)."""

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        """One call; its response is read on the executor thread that received it (see `_decoded_or_error`).
        Not `async_exec`: its pybind callback is what r26.07 fixed a use-after-free in."""
        infer = _infer_request(model, request)
        if model in self.decoupled_models:
            call = functools.partial(_one_decoupled_result, model, request, infer)
        else:
            call = functools.partial(_one_result, model, request, infer)
        result = await self._within_timeout(model, asyncio.get_running_loop().run_in_executor(None, call))
        if isinstance(result, Exception):
            raise result
        return result

    async def _within_timeout(self, model: str, awaitable):
        try:
            return await asyncio.wait_for(awaitable, self.stall_timeout_s)
        except TimeoutError:
            log.error("engine model %s did not answer for %.0f s", model, self.stall_timeout_s)
            raise EngineCallError(model, f"no response for {self.stall_timeout_s:.0f} s") from None

    async def stream(self, model: str, request: EngineRequest) -> AsyncIterator[EngineResult]:
        """A decoupled engine's streaming generation, a result per response. Triton 2.51's response
        iterator cannot be cancelled and blocks, so a thread of the loop's executor drains it into a
        queue; leaving early sends a `stop` for the sequence, which ends the generation at its next step."""
        if model not in self.decoupled_models:
            raise EngineCallError(model, "only a decoupled (in-flight) engine model streams")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        infer = _infer_request(model, request)

        def pump() -> None:
            try:
                for response in infer.exec(decoupled=True):
                    if response.has_error() or response.output_tensors():
                        loop.call_soon_threadsafe(queue.put_nowait, _decoded_or_error(model, request, response))
            except Exception as exc:  # the call could not be made: reported as the stream's failure
                loop.call_soon_threadsafe(queue.put_nowait, EngineCallError(model, str(exc)))
            loop.call_soon_threadsafe(queue.put_nowait, None)

        drained = loop.run_in_executor(None, pump)
        made: list[int] = []
        try:
            while (result := await self._within_timeout(model, queue.get())) is not None:
                if isinstance(result, Exception):
                    raise result
                made += result.tokens
                yield result
        finally:
            if not request.generation_done(made):  # left early: end the generation
                await self.release(model, request.request_id)
            try:
                await self._within_timeout(model, asyncio.shield(drained))
            except EngineCallError:  # a stuck iterator holds one executor thread; the request goes on
                log.error("abandoned the response iterator of %s for %s", model, request.request_id)

    async def release(self, model: str, request_id: str) -> None:
        """Tell an engine the sequence is over (tensorrt_llm's `stop`), so it frees the cached state."""
        try:
            await self.generate(model, EngineRequest.release(request_id))
        except Exception as exc:  # freeing is best effort: LRU eviction reclaims the slot anyway
            log.warning("could not release %s in %s: %s", request_id, model, exc)


def _infer_request(model: str, request: EngineRequest):
    tensors = [pb_utils.Tensor(name, array) for name, array in build_engine_inputs(request).items()]
    return pb_utils.InferenceRequest(
        model_name=model,
        inputs=tensors,
        requested_output_names=["output_ids", "sequence_length"]
        + (["generation_logits"] if request.return_generation_logits else []),
        request_id=request.request_id,
    )


def _decoded_or_error(model: str, request: EngineRequest, response) -> EngineResult | EngineCallError:
    """A response as an EngineResult (or the error it carries), read on the thread that received it and
    copied out of Triton's shared memory: only plain Python and numpy objects cross to the event loop,
    never a response or tensor object of the stub, whose memory the stub may reclaim meanwhile."""
    if response.has_error():
        return EngineCallError(model, response.error().message())
    outputs = {t.name(): np.array(t.as_numpy(), copy=True) for t in response.output_tensors()}
    return decode_engine_outputs(request, outputs)


def _one_result(model: str, request: EngineRequest, infer) -> EngineResult | EngineCallError:
    """A model's one response; blocking: runs on an executor thread."""
    return _decoded_or_error(model, request, infer.exec())


def _one_decoupled_result(model: str, request: EngineRequest, infer) -> EngineResult | EngineCallError:
    """The one data (or error) response of a decoupled engine model, drained to the end (the FINAL
    flag); blocking: runs on an executor thread."""
    results = [_decoded_or_error(model, request, r) for r in infer.exec(decoupled=True)
               if r.has_error() or r.output_tensors()]
    if len(results) != 1:
        return EngineCallError(model, f"expected one response from a decoupled engine model, got {len(results)}")
    return results[0]
