"""Triton adapter for every engine model (llm, ssm_*): tensors in, Engine.generate, tensors out.

What an engine can do beyond `Engine` is read from the capability protocols of engines/api.py
(BatchEngine, InflightEngine, MeteredEngine), never from probed attributes.

A model whose config is decoupled (ssm_q4: its engine is an InflightEngine) hands each request to the
engine's `submit` and returns at once; the engine answers each request, with one response carrying the
FINAL flag, when its work is done; a `streaming` generation gets one response per token, as
tensorrt_llm streams, the last one FINAL. Triton can then deliver the next requests while earlier ones are still
decoding, so they join the running steps (as TensorRT-LLM's decoupled in-flight batching does). Other
models answer their whole dynamic batch from `execute`."""

from __future__ import annotations

import json
import logging
import time
import uuid

import triton_python_backend_utils as pb_utils

from minions.decoding.engine_call import KEEP_SEQUENCE_PARAMETER, STREAM_INTERVAL_PARAMETER, EngineResult
from minions.engines.api import BatchEngine, InflightEngine
from minions.engines.factory import build_engine
from minions.engines.step_lock import step_lock_path
from minions.engines.tensors import CallTimes, encode_engine_outputs, parse_engine_inputs
from minions.errors import InvalidRequest
from minions.settings import EngineSettings

from .common import error, input_arrays, model_config, release_metrics, setup_logging, string_parameters
from .metrics import EngineGauges
from .outbox import Outbox

log = logging.getLogger("minions.engine")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        setup_logging()
        config = model_config(args)
        self.name = args["model_name"]
        settings = EngineSettings.from_params(string_parameters(config))
        start = time.perf_counter()
        self.engine = build_engine(settings, step_lock_path(args["model_repository"]))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        if self.decoupled and not isinstance(self.engine, InflightEngine):
            raise pb_utils.TritonModelException(f"{self.name}: engine {settings.engine!r} cannot serve "
                                                "a decoupled model (it has no in-flight batching)")
        self.gauges = EngineGauges(self.name, self.engine)
        self.outbox = Outbox(self.name, self.gauges.observe)
        log.info("%s: %s engine ready in %.1f s%s", self.name, settings.engine, time.perf_counter() - start,
                 " (decoupled, in-flight batching)" if self.decoupled else "")

    def execute(self, requests):
        """Serve Triton's dynamic batch: a BatchEngine gets every request in one call."""
        if self.decoupled:
            return self._submit(requests)
        arrival = time.time_ns()
        parsed, responses = [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                parsed.append((i, request, *self._parse(request)))
            except InvalidRequest as exc:
                responses[i] = pb_utils.InferenceResponse(error=error(str(exc), pb_utils.TritonError.INVALID_ARG))
        flat = [r for _, _, engine_requests, _ in parsed for r in engine_requests]
        try:
            results = self._generate(flat)
        except Exception as exc:  # a failing engine must not take the model down
            log.exception("%s: batch of %d failed", self.name, len(flat))
            results = [exc] * len(flat)
        done = time.time_ns()
        offset = 0
        for i, request, engine_requests, ends in parsed:
            mine = results[offset : offset + len(engine_requests)]
            offset += len(engine_requests)
            if ends:  # a whole request: its sequence ends (kept as a prefix where the engine caches them)
                for r in engine_requests:
                    self.engine.release(r.request_id)
            responses[i] = self.respond(request, engine_requests, mine, CallTimes(arrival, done, done))
        self.outbox.changed()
        return responses

    def _submit(self, requests) -> None:
        """Hand every request to the engine and return; each gets its one FINAL response when done."""
        calls = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                engine_requests, ends = self._parse(request)
            except InvalidRequest as exc:
                sender.send(pb_utils.InferenceResponse(error=error(str(exc), pb_utils.TritonError.INVALID_ARG)),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            if len(engine_requests) > 1 and any(r.streaming for r in engine_requests):
                sender.send(pb_utils.InferenceResponse(error=error(
                    "streaming takes one sequence per request", pb_utils.TritonError.INVALID_ARG)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            if not engine_requests:  # nothing to compute (an empty batch dimension): answer at once
                now = time.time_ns()
                sender.send(self.respond(request, [], [], CallTimes(now, now, now)),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for r in engine_requests:  # a whole request: the engine ends its sequence with its last answer
                r.ends_sequence = ends
            collect = _Collector(self, request, sender, engine_requests)
            self.outbox.watch(collect)
            calls.extend((r, collect.answer_for(i)) for i, r in enumerate(engine_requests))
        if calls:
            try:
                self.engine.submit(calls)
            except Exception as exc:  # the engine is shutting down: every request still gets its FINAL
                log.exception("%s: could not take %d calls", self.name, len(calls))
                for _, answer in calls:
                    answer(exc)
        return None

    def _parse(self, request):
        """The request's engine calls, and whether its sequence ends with this call. A call continues
        a sequence only when it names one as its correlation id (Minions' orchestrator does, and sends
        `stop` at the end); a tensorrt_llm client's request is whole, so its sequence ends once it is
        answered, and stays in the prefix cache for later requests. Keyed by its request id (a fresh
        one when it has none)."""
        sequence_id = str(request.correlation_id() or "")
        ends = not sequence_id
        request_id = sequence_id or request.request_id() or f"request-{uuid.uuid4().hex}"
        engine_requests = parse_engine_inputs(input_arrays(request), request_id)
        parameters = json.loads(request.parameters() or "{}")
        interval_ms = parameters.get(STREAM_INTERVAL_PARAMETER, 0)
        if not isinstance(interval_ms, (int, float)) or interval_ms < 0:
            raise InvalidRequest(f"request parameter {STREAM_INTERVAL_PARAMETER!r} must be a number of ms >= 0")
        keep = parameters.get(KEEP_SEQUENCE_PARAMETER, False)
        if not isinstance(keep, bool):
            raise InvalidRequest(f"request parameter {KEEP_SEQUENCE_PARAMETER!r} must be a boolean")
        for r in engine_requests:
            r.stream_interval_s = interval_ms / 1000
            r.keep_sequence = keep
        return engine_requests, ends

    def _generate(self, engine_requests: list) -> list:
        """Every request's result, or its exception in its place."""
        if isinstance(self.engine, BatchEngine):
            return self.engine.generate_batch(engine_requests)
        results = []
        for r in engine_requests:
            try:
                results.append(self.engine.generate(r))
            except Exception as exc:
                results.append(exc)
        return results

    def respond(self, request, engine_requests: list, results: list, times: CallTimes):
        failure = next((r for r in results if isinstance(r, Exception)), None)
        if isinstance(failure, InvalidRequest):
            return pb_utils.InferenceResponse(error=error(str(failure), pb_utils.TritonError.INVALID_ARG))
        if failure is not None:
            log.error("%s: request failed: %s: %s", self.name, type(failure).__name__, failure)
            return pb_utils.InferenceResponse(error=error(f"{self.name}: {type(failure).__name__}: {failure}"))
        try:
            outputs = encode_engine_outputs(engine_requests, results, times)
        except InvalidRequest as exc:  # asked for what this engine does not compute (log probs of an n-gram)
            return pb_utils.InferenceResponse(error=error(str(exc), pb_utils.TritonError.INVALID_ARG))
        wanted = set(request.requested_output_names() or outputs)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in outputs.items() if name in wanted]
        )

    def finalize(self) -> None:
        if isinstance(self.engine, InflightEngine):
            self.engine.close()
        self.outbox.close()  # after the engine: its last answers go out first
        release_metrics(self.gauges)
        log.info("%s: unloaded", self.name)


class _Collector:
    """Gathers the answers to one Triton request's rows (from the engine's thread, through the outbox)
    and sends its response, FINAL, once the last one is in; a streaming row's partial results go out
    as they come. A cancelled request (its client has gone) gets only the FINAL flag."""

    def __init__(self, model: TritonPythonModel, request, sender, engine_requests: list) -> None:
        self.model, self.request, self.sender = model, request, sender
        self.engine_requests = engine_requests
        self.results: list = [None] * len(engine_requests)
        self.missing = len(engine_requests)
        self.arrival_ns = time.time_ns()
        self.first_token_ns = 0
        self.generated = [0] * len(engine_requests)
        self.cancelled = False

    def cancel(self) -> None:
        """On the outbox's thread: the client has gone; the engine ends this request's calls."""
        self.cancelled = True
        log.info("%s: request %s cancelled by its client: its %d calls end", self.model.name,
                 self.engine_requests[0].request_id, len(self.engine_requests))
        self.model.engine.cancel(self.engine_requests)

    def answer_for(self, i: int):
        def answer(result) -> None:
            self.model.outbox.put(lambda: self._deliver(i, result))
        return answer

    def _deliver(self, i: int, result) -> None:
        """On the outbox's thread, one at a time."""
        now = time.time_ns()
        self.first_token_ns = self.first_token_ns or now
        if isinstance(result, EngineResult):
            self.generated[i] += len(result.tokens)
        times = CallTimes(self.arrival_ns, self.first_token_ns, now, tuple(self.generated))
        if isinstance(result, EngineResult) and not result.final:
            if not self.cancelled:
                self.sender.send(self.model.respond(self.request, self.engine_requests, [result], times))
            return
        self.results[i] = result
        self.missing -= 1
        if self.missing:
            return
        self.model.outbox.answered(self)
        if self.cancelled or any(r.stop or r.ends_sequence for r in self.engine_requests):
            # The sequence's state changed for good (freed, kept, or ended with its client): the gauges
            # go out before the answer, so a client that has it sees the engine's state after the call.
            self.model.outbox.export_gauges()
        if self.cancelled:
            self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        response = self.model.respond(self.request, self.engine_requests, self.results, times)
        self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

