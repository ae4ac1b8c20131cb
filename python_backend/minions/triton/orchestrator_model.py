"""The `minions` BLS model (decoupled): request -> tokens -> speculative decoding -> streamed text.

Each request is handed to its own asyncio task, so concurrency is not bounded by the instance count;
`execute` returns at once. The loop itself lives in minions.decode_loop and reaches the engine models
through TritonEngineClient. Every request ends with exactly one FINAL flag, whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing

import numpy as np
import triton_python_backend_utils as pb_utils

from ..bad_words import BadWords
from ..bandit import Ucb1
from ..batch_gate import BatchGate, GatedClient
from ..decode_loop import DecodePlan, DecodeStats, speculative_decode
from ..detokenizer import IncrementalDetokenizer
from ..errors import InvalidRequest
from ..generation_request import GenerationRequest, Limits, parse_generation_request
from ..draft_length import LengthPolicy, SharedLengthStats
from ..pipeline_pool import DraftPool, KvAdmission
from ..prompt import encode_prompt
from ..ssm_health import SsmHealth
from ..ssm_weights import SsmWeights
from ..stop_strings import StopStringMatcher
from .common import error, input_arrays, model_config, setup_logging, string_parameters
from .engine_client import TritonEngineClient
from .metrics import SpeculationMetrics

log = logging.getLogger("minions.bls")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class RequestCancelled(Exception):
    pass


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        setup_logging()
        config = model_config(args)
        params = string_parameters(config)
        self.name = args["model_name"]
        self.input_names = [i["name"] for i in config["input"]]
        self.llm = params["llm_model_name"]
        self.limits = Limits(
            max_context=int(params["max_context"]),
            max_tokens_limit=int(params["max_tokens_limit"]),
            default_max_tokens=int(params["default_max_tokens"]),
            default_num_draft_tokens=(None if params["default_num_draft_tokens"] == "adaptive"
                                      else int(params["default_num_draft_tokens"])),
            max_num_draft_tokens=int(params["max_num_draft_tokens"]),
            default_speculation=params["default_speculation"],
            default_chat=params["default_chat"] == "true",
            default_use_draft_logits=params.get("default_use_draft_logits", "false") == "true",
            default_pipeline=params.get("default_pipeline", "false") == "true",
            ssm_names=tuple(n for n in params["ssm_model_names"].split(",") if n),
        )
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_path"], local_files_only=True)
        self.client = TritonEngineClient(frozenset(n for n in params.get("decoupled_model_names", "").split(",") if n))
        window_ms = float(params.get("llm_batch_window_ms", 0) or 0)
        if window_ms > 0:  # whole LLM batches instead of alternating cohorts (batch_gate.py)
            self.client = GatedClient(self.client, self.llm, BatchGate(window_ms / 1000.0))
        self.metrics = SpeculationMetrics(self.name)
        self.health = SsmHealth()
        # Learnt across requests: the vote's SSM weights and the bandit's arm statistics.
        self.weights = SsmWeights(self.limits.ssm_names)
        self.bandit = Ucb1(self.limits.ssm_names)
        self.vote_deadline_s = float(params.get("vote_deadline_ms", 500)) / 1000.0
        self.vote_explore_every = int(params.get("vote_explore_every", 8))
        candidates = tuple(int(c) for c in params.get("draft_length_candidates", "0,1,2,3,4,6,8").split(",") if c)
        self.length_stats = SharedLengthStats(LengthPolicy(candidates=candidates))
        # The pipeline's throttles: at most one LLM batch of drafts waiting, and KV admission.
        self.pool = DraftPool(int(params.get("draft_pool_size", 8)))
        max_load = int(params.get("pipeline_max_load", 0) or 0)
        self.pipeline_max_load = max_load if max_load > 0 else None
        min_hit = float(params.get("pipeline_min_hit", 0) or 0)
        self.pipeline_min_hit = min_hit if min_hit > 0 else None
        budget = int(params.get("kv_budget_tokens", 0) or 0)
        self.admission = KvAdmission(budget, int(params.get("kv_chunk_tokens", 1))) if budget > 0 else None
        self.active = 0
        self.tasks: set[asyncio.Task] = set()
        self._executor_set = False
        log.info("%s: ready (llm=%s, ssms=%s, default speculation %s)", self.name, self.llm,
                 ",".join(self.limits.ssm_names), self.limits.default_speculation)

    async def execute(self, requests):
        loop = asyncio.get_running_loop()
        if not self._executor_set:  # BLS calls block a pool thread each: size it for many streams
            loop.set_default_executor(ThreadPoolExecutor(max_workers=128, thread_name_prefix="bls"))
            self._executor_set = True
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
            greq = parse_generation_request(input_arrays(request, self.input_names), self.limits)
            mode = greq.speculation.label
            start = time.perf_counter()
            await self._generate(greq, request_id, sender)
            self.metrics.observe_request(mode, "success", time.perf_counter() - start)
            self.metrics.observe_weights(self.weights.snapshot())
        except InvalidRequest as exc:
            log.info("%s: rejected: %s", request_id, exc)
            self.metrics.observe_request(mode, "invalid")
            self._finish(sender, request_id, error(str(exc), pb_utils.TritonError.INVALID_ARG))
        except RequestCancelled:
            log.info("%s: cancelled by the client", request_id)
            self.metrics.observe_request(mode, "cancelled")
            self._finish(sender, request_id, None)
        except Exception as exc:
            log.exception("%s: failed", request_id)
            self.metrics.observe_request(mode, "error")
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
        prompt_ids = encode_prompt(self.tokenizer, greq.text, greq.chat)
        if len(prompt_ids) >= self.limits.max_context:
            raise InvalidRequest(
                f"prompt is {len(prompt_ids)} tokens; the context holds {self.limits.max_context} "
                "including at least one generated token"
            )
        end_id = greq.end_id if greq.end_id is not None else self.tokenizer.eos_token_id
        plan = DecodePlan(
            prompt_ids=prompt_ids,
            max_new_tokens=min(greq.max_tokens, self.limits.max_context - len(prompt_ids)),
            sampling=greq.sampling,
            seed=greq.seed,
            end_id=end_id,
            bad_words=BadWords([self.tokenizer.encode(w, add_special_tokens=False) for w in greq.bad_words]),
            speculation=greq.speculation,
            num_draft_tokens=greq.num_draft_tokens,
            max_draft_tokens=self.limits.max_num_draft_tokens,
            length_stats=self.length_stats,
            pipeline=greq.pipeline,
            pipeline_max_load=self.pipeline_max_load,
            pipeline_min_hit=self.pipeline_min_hit,
            pool=self.pool,
            load=lambda: self.active,
            use_draft_logits=greq.use_draft_logits,
            llm=self.llm,
            health=self.health,
            weights=self.weights,
            bandit=self.bandit,
            vote_deadline_s=self.vote_deadline_s,
            vote_explore_every=self.vote_explore_every,
        )
        reservation = None
        if self.admission is not None:  # wait (in order) until the worst case fits the KV budget
            worst = len(prompt_ids) + plan.max_new_tokens + self.limits.max_num_draft_tokens + 1
            if not self.admission.fits_now(worst):
                log.info("%s: waiting for KV budget (%d tokens in use of %d, %d waiting)", request_id,
                         self.admission.in_use, self.admission.capacity, self.admission.waiting)
            reservation = await self.admission.reserve(worst)
        self.active += 1
        try:
            await self._decode(greq, plan, request_id, sender, prompt_ids, end_id)
        finally:
            self.active -= 1
            if reservation is not None:
                reservation.release()

    async def _decode(self, greq: GenerationRequest, plan: DecodePlan, request_id: str, sender, prompt_ids: list[int],
                      end_id: int) -> None:
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringMatcher(greq.stop_words)
        stats = DecodeStats()
        finish_reason = "length"
        pending = ""  # text not yet sent (all of it when not streaming)
        start = time.perf_counter()
        async with aclosing(speculative_decode(self.client, plan, request_id)) as rounds:
            async for r in rounds:
                stats.add(r)
                self.metrics.observe_round(r, greq.speculation.label)
                tokens = r.tokens
                if end_id in tokens:
                    tokens = tokens[: tokens.index(end_id)]
                    finish_reason = "stop"
                pending += stops.feed(detok.push(tokens))
                if stops.stopped:
                    finish_reason = "stop"
                if sender.is_cancelled():
                    raise RequestCancelled()
                if r.last or stops.stopped:
                    break
                if greq.stream and pending:
                    sender.send(self._response(greq, pending, stats, None))
                    pending = ""
            # Still inside the block: the client gets its final response before the engines' caches
            # are released (aclose), so freeing state never delays the end of the stream.
            if not stops.stopped:
                pending += stops.feed(detok.flush()) + stops.flush()
            if not greq.stream and not greq.exclude_input_in_output:
                pending = greq.text + pending
            sender.send(self._response(greq, pending, stats, finish_reason), flags=FINAL)
        elapsed = time.perf_counter() - start
        log.info(
            "%s: %s, %d prompt + %d new tokens in %.2f s (%.1f tok/s; drafting %.2f s, verifying %.2f s, "
            "control %.4f s), %d LLM calls, acceptance %.2f, draft length %s, pipeline %s (%d early drafts used, "
            "%d discarded), finish %s",
            request_id, greq.speculation, len(prompt_ids), stats.emitted_tokens, elapsed,
            stats.emitted_tokens / max(elapsed, 1e-9), stats.draft_seconds, stats.verify_seconds, stats.control_seconds,
            stats.verifications, stats.acceptance_rate,
            "adaptive" if greq.num_draft_tokens is None else greq.num_draft_tokens, "on" if greq.pipeline else "off",
            stats.pipelined_drafts, stats.discarded_early_drafts, finish_reason,
        )

    def _response(self, greq: GenerationRequest, text: str, stats: DecodeStats, finish_reason: str | None):
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("num_output_tokens", np.array([stats.emitted_tokens], dtype=np.int32)),
        ]
        if finish_reason is not None:
            tensors.append(pb_utils.Tensor("finish_reason", np.array([finish_reason.encode()], dtype=np.object_)))
        if greq.return_perf_metrics:
            tensors += [
                pb_utils.Tensor("acceptance_rate", np.array([stats.acceptance_rate], dtype=np.float32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([stats.accepted_tokens], dtype=np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([stats.draft_tokens], dtype=np.int32)),
                pb_utils.Tensor("num_verifications", np.array([stats.verifications], dtype=np.int32)),
                pb_utils.Tensor("draft_lengths", np.array(stats.planned_lengths, dtype=np.int32)),
                pb_utils.Tensor("num_pipelined_drafts", np.array([stats.pipelined_drafts], dtype=np.int32)),
            ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        log.info("%s: unloaded", self.name)
