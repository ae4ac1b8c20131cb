"""The `minions` BLS model (decoupled): request -> tokens -> speculative decoding -> streamed text.

Each request is handed to its own asyncio task, so concurrency is not bounded by the instance count;
`execute` returns at once. The request flow (minions.serving.flow) and the decode loop
(minions.speculation.loop) are plain Python; this adapter receives, sends and logs, and the loop
reaches the engine models through TritonEngineClient. Every request ends with exactly one FINAL
flag, whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import aclosing

import triton_python_backend_utils as pb_utils

from minions.errors import InvalidRequest
from minions.serving.admission import KvAdmission
from minions.serving.flow import TextStream, admit, decode_request, response_arrays
from minions.serving.request import GenerationRequest, parse_generation_request
from minions.settings import OrchestratorSettings
from minions.speculation.loop import speculative_decode
from minions.speculation.plan import DecodeRequest, Services

from .common import error, input_arrays, model_config, setup_logging, string_parameters
from .engine_client import TritonEngineClient
from .metrics import METRICS_FLUSH_INTERVAL_S, SpeculationMetrics

log = logging.getLogger("minions.bls")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


CANCEL_CHECK_INTERVAL_S = 0.05
"""How often a decoding request asks Triton whether its client cancelled: the question is a round trip
to tritonserver, too dear to ask for every streamed token."""


class RequestCancelled(Exception):
    pass


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        setup_logging()
        config = model_config(args)
        self.name = args["model_name"]
        self.input_names = [i["name"] for i in config["input"]]
        self.settings = OrchestratorSettings.from_params(string_parameters(config))
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.settings.tokenizer_path, local_files_only=True)
        self.client = TritonEngineClient(self.settings.engine_grpc_url, frozenset(self.settings.decoupled_model_names),
                                         self.settings.engine_stall_timeout_s)
        self.metrics = SpeculationMetrics(self.name)
        self.active = 0
        self.services = Services.from_settings(self.settings, load=lambda: self.active)
        budget = self.settings.kv_budget_tokens
        self.admission = KvAdmission(budget, self.settings.kv_chunk_tokens) if budget > 0 else None
        self.tasks: set[asyncio.Task] = set()
        self._flushing = False
        log.info("%s: ready (llm=%s, ssms=%s, default speculation %s)", self.name, self.settings.llm_model_name,
                 ",".join(self.settings.ssm_model_names), self.settings.default_speculation)

    async def execute(self, requests):
        loop = asyncio.get_running_loop()
        if not self._flushing:  # the stub's event loop runs from the first execute on
            self.tasks.add(loop.create_task(self.metrics.flush_every(METRICS_FLUSH_INTERVAL_S)))
            self._flushing = True
        for request in requests:
            task = loop.create_task(self._serve(request))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def _serve(self, request) -> None:
        sender = request.get_response_sender()
        request_id = f"{request.request_id() or 'req'}-{uuid.uuid4().hex[:12]}"
        mode = "invalid"
        try:
            greq = parse_generation_request(input_arrays(request, self.input_names), self.settings)
            mode = greq.speculation.label
            start = time.perf_counter()
            await self._generate(greq, request_id, sender)
            self.metrics.tally.observe_request(mode, "success", time.perf_counter() - start)
            self.metrics.tally.observe_weights(self.services.weights.snapshot())
        except InvalidRequest as exc:
            log.info("%s: rejected: %s", request_id, exc)
            self.metrics.tally.observe_request(mode, "invalid")
            self._finish(sender, request_id, error(str(exc), pb_utils.TritonError.INVALID_ARG))
        except RequestCancelled:
            log.info("%s: cancelled by the client", request_id)
            self.metrics.tally.observe_request(mode, "cancelled")
            self._finish(sender, request_id, None)
        except Exception as exc:
            log.exception("%s: failed", request_id)
            self.metrics.tally.observe_request(mode, "error")
            self._finish(sender, request_id, error(f"{type(exc).__name__}: {exc}"))

    @staticmethod
    def _finish(sender, request_id: str, err) -> None:
        """Close the stream with its one FINAL flag (with the error, if any); a vanished client is logged."""
        try:
            if err is None:
                sender.send(flags=FINAL)
            else:
                sender.send(pb_utils.InferenceResponse(error=err), flags=FINAL)
        except Exception as exc:
            log.warning("%s: could not send the final response: %s", request_id, exc)

    async def _generate(self, greq: GenerationRequest, request_id: str, sender) -> None:
        request = decode_request(greq, self.tokenizer, self.settings)
        reservation = await admit(self.admission, request, request_id)
        self.active += 1
        try:
            await self._decode(greq, request, request_id, sender)
        finally:
            self.active -= 1
            if reservation is not None:
                reservation.release()

    async def _decode(self, greq: GenerationRequest, request: DecodeRequest, request_id: str, sender) -> None:
        text = TextStream(greq, self.tokenizer, request.end_id)
        start = time.perf_counter()
        next_cancel_check = 0.0
        async with aclosing(speculative_decode(self.client, request, self.services, request_id)) as rounds:
            async for r in rounds:
                done = text.add(r)
                self.metrics.tally.observe_round(r, greq.speculation.label)
                if time.monotonic() >= next_cancel_check:
                    if sender.is_cancelled():
                        raise RequestCancelled()
                    next_cancel_check = time.monotonic() + CANCEL_CHECK_INTERVAL_S
                if done:
                    break
                if chunk := text.chunk():
                    sender.send(self._response(greq, chunk, text, None))
            # Still inside the block: the client gets its final response before the engines' caches
            # are released (aclose), so freeing state never delays the end of the stream. The rounds'
            # metrics are exported first, so a client that has its answer sees them counted.
            self.metrics.flush()
            sender.send(self._response(greq, text.final(), text, text.finish_reason), flags=FINAL)
        elapsed, stats = time.perf_counter() - start, text.stats
        log.info(
            "%s: %s, %d prompt + %d new tokens in %.2f s (%.1f tok/s; drafting %.2f s, verifying %.2f s, "
            "control %.4f s), %d LLM calls, acceptance %.2f, draft length %s, pipeline %s (%d early drafts used, "
            "%d discarded), finish %s",
            request_id, greq.speculation, len(request.prompt_ids), stats.emitted_tokens, elapsed,
            stats.emitted_tokens / max(elapsed, 1e-9), stats.draft_seconds, stats.verify_seconds, stats.control_seconds,
            stats.verifications, stats.acceptance_rate,
            "adaptive" if greq.num_draft_tokens is None else greq.num_draft_tokens, "on" if greq.pipeline else "off",
            stats.pipelined_drafts, stats.discarded_early_drafts, text.finish_reason,
        )

    @staticmethod
    def _response(greq: GenerationRequest, chunk: str, text: TextStream, finish_reason: str | None):
        arrays = response_arrays(greq, chunk, text.stats, finish_reason)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays.items()])

    def finalize(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        log.info("%s: unloaded", self.name)
