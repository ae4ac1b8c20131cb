"""The `minions` orchestrator model (decoupled): request -> tokens -> speculative decoding -> streamed text.

Each request is handed to its own asyncio task, so concurrency is not bounded by the instance count;
`execute` returns at once. The request flow (minions.serving.flow) and the decode loop
(minions.speculation.loop) are plain Python; this adapter receives, sends and logs, and the loop
reaches the engine models through TritonEngineClient. Every request ends with exactly one FINAL
flag, whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path

import triton_python_backend_utils as pb_utils

from minions.engines.in_process import InProcessEngines
from minions.errors import INTERNAL_PREFIX, InvalidRequest, ModelUnavailable, RequestCancelled, ServerBusy
from minions.serving.admission import Admission, Reservation
from minions.serving.flow import RequestPerf, TextStream, admit, decode_request, response_arrays
from minions.serving.metric_tally import METRICS_FLUSH_INTERVAL_S
from minions.serving.request import GenerationRequest, parse_generation_request
from minions.settings import OrchestratorSettings
from minions.speculation.decode_request import DecodeRequest
from minions.speculation.loop import speculative_decode
from minions.speculation.services import Services

from .common import (CANCEL_CHECK_INTERVAL_S, error, input_arrays, model_config, release_metrics, setup_logging,
                     string_parameters)
from .engine_client import EngineCallError, TritonEngineClient
from .lookups import in_process_lookups
from .metrics import EngineGauges, SpeculationMetrics
from .model_control import ModelControl

log = logging.getLogger("minions.orchestrator")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


FINALIZE_TIMEOUT_S = 5.0
"""How long an unload waits for the requests' tasks to end once cancelled, and then for the loop's thread."""


class _Reply:
    """A request's response sender, which sends exactly one FINAL flag and counts the tokens sent."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self.tokens = 0
        self.closed = False

    def send(self, response, tokens: int, final: bool = False) -> None:
        self.sender.send(response, flags=FINAL if final else 0)
        self.tokens = tokens
        self.closed = final

    def cancelled(self) -> bool:
        """Whether the client cancelled a stream still open (a round trip to tritonserver)."""
        return not self.closed and self.sender.is_cancelled()

    def finish(self, err=None) -> None:
        """Close the stream with its FINAL flag (with the error, if any) unless it is closed already; a
        vanished client is logged."""
        if self.closed:
            return
        self.closed = True
        try:
            if err is None:
                self.sender.send(flags=FINAL)
            else:
                self.sender.send(pb_utils.InferenceResponse(error=err), flags=FINAL)
        except Exception as exc:
            log.warning("could not send the final response: %s", exc)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        setup_logging()
        config = model_config(args)
        self.name = args["model_name"]
        self.settings = OrchestratorSettings.from_params(string_parameters(config))
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.settings.tokenizer_path, local_files_only=True)
        self.client = TritonEngineClient(self.settings.engine_grpc_url, frozenset(self.settings.decoupled_model_names),
                                         self.settings.engine_stall_timeout_s, frozenset(self.settings.trtllm_model_names))
        repository = Path(args["model_repository"]).parent
        lookups = (in_process_lookups(repository, self.settings.lookup_model_names)
                   if self.settings.lookups_in_process else {})
        self.engines = InProcessEngines(self.client, lookups)
        """What the decode loop calls: the lookups here, every other model through Triton (self.client)."""
        self.metrics = SpeculationMetrics(self.name, [EngineGauges(name, engine) for name, engine in lookups.items()])
        self.admission = Admission(self.settings.active_requests_limit, self.settings.kv_budget_tokens,
                                   self.settings.kv_chunk_tokens, self.settings.limits.queued_requests,
                                   on_change=self.metrics.tally.observe_admission)
        self.metrics.tally.observe_admission(0, 0, 0.0)  # the series exist from the start
        self.services = Services.from_settings(self.settings, load=lambda: self.admission.decoding)
        self.services.on_probe = self.metrics.tally.observe_probe
        self.models = ModelControl(self.client, repository, self.services, tally=self.metrics.tally,
                                   poll_interval_s=self.settings.model_poll_interval_s,
                                   reload=self.settings.ssm_health.reload, on_join=self._join)
        self.tasks: set[asyncio.Task] = set()
        # The model's own event loop, in a thread of its own from load on, runs every task: the repository
        # watch starts at load, not at the first request, and execute is synchronous. An async execute ran
        # on the stub's loop, whose bookkeeping of such coroutines races with their end in Triton 2.51
        # (`Cannot remove future from background; KeyError`, triton-inference-server/server#8537).
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        self._spawn(self.metrics.flush_every(METRICS_FLUSH_INTERVAL_S))
        self._spawn(self.models.watch())
        log.info("%s: ready (llm=%s, ssms=%s, in this process: %s; default speculation %s)", self.name,
                 self.settings.llm_model_name, ",".join(self.settings.ssm_model_names), ",".join(lookups) or "none",
                 self.settings.default_speculation)

    def _join(self, ssm: str, decoupled: bool, native: bool) -> None:
        """A new SSM model (ModelControl found it READY): requests name it, vote and bandit draft with it.
        A native one (TensorRT-LLM's own) is called with tensorrt_llm's inputs only and keeps no sequence."""
        names, decoupled_names = (*self.settings.ssm_model_names, ssm), self.settings.decoupled_model_names
        native_names = self.settings.trtllm_model_names
        if decoupled:
            decoupled_names = (*decoupled_names, ssm)
        if native:
            native_names = (*native_names, ssm)
        self.settings = replace(self.settings, ssm_model_names=names, decoupled_model_names=decoupled_names,
                                trtllm_model_names=native_names)
        self.client.decoupled_models = frozenset(decoupled_names)
        self.client.native_models = frozenset(native_names)
        self.services.add_ssm(ssm)

    def execute(self, requests):
        for request in requests:
            self._spawn(self._serve(request))
        return None

    def _spawn(self, coroutine) -> None:
        """Run a coroutine as a task on the model's loop (from any thread); finalize cancels what runs."""
        def start() -> None:
            task = self._loop.create_task(coroutine)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        self._loop.call_soon_threadsafe(start)

    async def _serve(self, request) -> None:
        perf = RequestPerf(time.time_ns(), block_tokens=self.settings.kv_chunk_tokens)
        reply = _Reply(request.get_response_sender())
        request_id = f"{request.request_id() or 'req'}-{uuid.uuid4().hex[:12]}"
        mode, outcome, detail, start = "invalid", "error", "", time.perf_counter()
        try:
            greq = parse_generation_request(input_arrays(request), self.settings)
            mode = greq.speculation.label
            detail = await self._until_cancelled(reply, self._generate(greq, request_id, reply, perf))
            outcome = "success"
            self.metrics.tally.observe_latency(mode, *perf.latencies(reply.tokens))
            self.metrics.tally.observe_weights(self.services.weights.snapshot())
        except InvalidRequest as exc:
            outcome, detail = "invalid", str(exc)
            reply.finish(error(str(exc), pb_utils.TritonError.INVALID_ARG))
        except (ServerBusy, ModelUnavailable) as exc:
            outcome, detail = "unavailable", str(exc)
            reply.finish(error(str(exc), pb_utils.TritonError.UNAVAILABLE))
        except RequestCancelled:
            outcome = "cancelled"
            reply.finish()
        except Exception as exc:
            if isinstance(exc, EngineCallError) and exc.model == self.settings.llm_model_name:
                self.models.llm_failed(str(exc))
            log.exception("%s: failed", request_id)
            detail = f"{type(exc).__name__}: {exc}"
            reply.finish(error(f"{INTERNAL_PREFIX}: {detail}"))
        finally:
            elapsed = time.perf_counter() - start
            self.metrics.tally.observe_request(mode, outcome, elapsed if outcome == "success" else 0.0)
            # One line per request, however it ended.
            log.info("%s: %s, %s, %d tokens in %.2f s%s", request_id, outcome, mode, reply.tokens, elapsed,
                     f"; {detail}" if detail else "")

    @staticmethod
    async def _until_cancelled(reply: _Reply, work):
        """Run `work`, asking Triton every CANCEL_CHECK_INTERVAL_S whether the client cancelled; if it
        did, cancel the work wherever it waits (for KV room, an SSM, the LLM) and raise RequestCancelled.
        The work's cleanup (releasing engine state and its KV reservation) runs before this returns."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=CANCEL_CHECK_INTERVAL_S)
                if done:
                    return task.result()
                if reply.cancelled():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    raise RequestCancelled()
        finally:
            if not task.done():  # the model is unloading: this coroutine itself was cancelled
                task.cancel()

    async def _generate(self, greq: GenerationRequest, request_id: str, reply: _Reply, perf: RequestPerf) -> str:
        if self.models.llm_unavailable:
            raise ModelUnavailable(self.models.llm_unavailable)
        request = decode_request(greq, self.tokenizer, self.settings)
        reservation = await admit(self.admission, request, request_id)
        perf.scheduled_ns, perf.prompt_tokens = time.time_ns(), len(request.prompt_ids)
        try:
            return await self._decode(greq, request, request_id=request_id, reply=reply, perf=perf,
                                      reservation=reservation)
        finally:
            reservation.release()

    async def _decode(self, greq: GenerationRequest, request: DecodeRequest, request_id: str, reply: _Reply,
                      perf: RequestPerf, reservation: Reservation) -> str:
        """Stream the request's text; returns what the request's log line says about its decoding."""
        text = TextStream(greq, self.tokenizer, request.end_id, perf)
        start = time.perf_counter()
        async with aclosing(speculative_decode(self.engines, request, services=self.services, request_id=request_id,
                                               on_llm_release=reservation.sequence_released)) as rounds:
            async for r in rounds:
                done = text.add(r)
                self.metrics.tally.observe_round(r, greq.speculation.label)
                if done:
                    break
                if chunk := text.chunk():
                    reply.send(self._response(greq, chunk, text, None), text.stats.emitted_tokens)
            # Still inside the block: the client gets its final response before the engines' caches
            # are released (aclose), so freeing state never delays the end of the stream. The rounds'
            # metrics are exported first, so a client that has its answer sees them counted.
            self.metrics.flush()
            reply.send(self._response(greq, text.final(), text, text.finish_reason), text.stats.emitted_tokens,
                       final=True)
            reservation.answer_sent()
        elapsed, stats = time.perf_counter() - start, text.stats
        return (
            f"{len(request.prompt_ids)} prompt tokens ({perf.cached_tokens} cached), "
            f"{stats.emitted_tokens / max(elapsed, 1e-9):.1f} tok/s (drafting "
            f"{stats.draft_seconds:.2f} s, verifying {stats.verify_seconds:.2f} s, control {stats.control_seconds:.4f} s), "
            f"{stats.rounds} rounds, {stats.llm_calls} LLM calls, acceptance {stats.acceptance_rate:.2f}, draft length "
            f"{'adaptive' if greq.num_draft_tokens is None else greq.num_draft_tokens}, pipeline "
            f"{'on' if greq.pipeline else 'off'} ({stats.pipelined_drafts} early drafts used, "
            f"{stats.discarded_early_drafts} discarded), finish {text.finish_reason}"
        )

    @staticmethod
    def _response(greq: GenerationRequest, chunk: str, text: TextStream, finish_reason: str | None):
        arrays = response_arrays(greq, chunk, text, finish_reason)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays.items()])

    def finalize(self) -> None:
        # finalize runs on the stub's main thread, the tasks on the loop's: cancel them there, wait for
        # them to end, then stop the loop. (Triton unloads a model once its requests are answered, so
        # what runs here is the repository watch and the metrics flush.)
        async def cancel_all() -> None:
            tasks = [task for task in self.tasks if not task.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=FINALIZE_TIMEOUT_S)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(FINALIZE_TIMEOUT_S + 1)
        except Exception as exc:  # a task that does not end in time is left to the process's exit
            log.warning("%s: not every task ended at unload: %r", self.name, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(FINALIZE_TIMEOUT_S)
        for gauges in self.metrics.engine_gauges:
            release_metrics(gauges)
        release_metrics(self.metrics)
        log.info("%s: unloaded", self.name)
