"""One request's flow around the decode loop, free of Triton: from the parsed request to a
DecodeRequest (prompt, limits, end_id, bad words), admission, and from rounds of tokens to the
text the client receives (end_id trimmed, detokenised, stop strings, finish_reason, stream chunks)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from minions.errors import InvalidRequest
from minions.serving.admission import Admission, Reservation
from minions.serving.request import GenerationRequest
from minions.settings import OrchestratorSettings
from minions.speculation.decode_request import DecodeRequest
from minions.speculation.rounds import DecodeStats, Round
from minions.text.bad_words import BadWords
from minions.text.detokenizer import IncrementalDetokenizer
from minions.text.prompt import encode_prompt
from minions.text.stop_strings import StopStringMatcher

log = logging.getLogger("minions.orchestrator")


class Tokenizer(Protocol):
    """What the flow needs of a transformers tokenizer."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, messages: list[dict], **kwargs) -> str: ...

    def __len__(self) -> int:
        """The vocabulary's size, added tokens included."""
        ...


def decode_request(greq: GenerationRequest, tokenizer: Tokenizer, settings: OrchestratorSettings) -> DecodeRequest:
    """The decode loop's request: the prompt tokenised (InvalidRequest if it leaves no room to
    generate), max_tokens bounded by the context, end_id defaulting to the tokenizer's EOS."""
    if greq.end_id is not None and not 0 <= greq.end_id < len(tokenizer):
        raise InvalidRequest(f"'end_id' must be a token id in [0, {len(tokenizer) - 1}], got {greq.end_id}")
    prompt_ids = encode_prompt(tokenizer, greq.text, greq.chat)
    if len(prompt_ids) >= settings.limits.context:
        raise InvalidRequest(
            f"prompt is {len(prompt_ids)} tokens; the context holds {settings.limits.context} "
            "including at least one generated token"
        )
    return DecodeRequest(
        prompt_ids=prompt_ids,
        max_new_tokens=min(greq.max_tokens, settings.limits.context - len(prompt_ids)),
        sampling=greq.sampling,
        penalties=replace(greq.penalties, prompt_length=len(prompt_ids)),
        seed=greq.seed,
        end_id=greq.end_id if greq.end_id is not None else tokenizer.eos_token_id,
        bad_words=BadWords([tokenizer.encode(w, add_special_tokens=False) for w in greq.bad_words]),
        speculation=greq.speculation,
        num_draft_tokens=greq.num_draft_tokens,
        max_draft_tokens=settings.limits.num_draft_tokens,
        stream_interval_s=settings.llm_stream.interval_ms / 1000,
        use_draft_logits=greq.use_draft_logits,
        pipeline=greq.pipeline,
        return_log_probs=greq.return_log_probs,
    )


async def admit(admission: Admission, request: DecodeRequest, request_id: str) -> Reservation:
    """Wait (in order) for a sequence slot and for the request's worst case to fit the KV budget:
    prompt, every new token, and one round's longest draft."""
    worst = len(request.prompt_ids) + request.max_new_tokens + request.max_draft_tokens + 1
    if not admission.fits_now(worst):
        log.info("%s: waiting for room (%d requests decoding of %d, %d KV tokens in use of %d, %d waiting)",
                 request_id, admission.holding_slots, admission.max_sequences, admission.in_use, admission.capacity,
                 admission.waiting)
    return await admission.reserve(worst)


@dataclass
class RequestPerf:
    """What tensorrt_llm's per-request perf outputs report: wall-clock moments (time.time_ns) and the
    request's KV blocks in the LLM."""

    arrival_ns: int
    scheduled_ns: int = 0
    """When admission let the request start decoding."""
    first_token_ns: int = 0
    last_token_ns: int = 0
    prompt_tokens: int = 0
    block_tokens: int = 1
    """Tokens per KV block: the LLM engine's allocation chunk (kv_chunk_tokens)."""
    cached_tokens: int = 0
    """Prompt tokens the LLM found in its prefix cache (Round.cached_tokens)."""

    def token_arrived(self) -> None:
        self.last_token_ns = time.time_ns()
        self.first_token_ns = self.first_token_ns or self.last_token_ns

    def latencies(self, tokens: int) -> tuple[float | None, float | None, float]:
        """Time to first token, mean time per output token after it, and end to end (to the last
        tokens, which the final response carries; not the engines' clean-up after it), in seconds (None
        where the request has no first token, or no second)."""
        e2e = ((self.last_token_ns or time.time_ns()) - self.arrival_ns) / 1e9
        if not self.first_token_ns:
            return None, None, e2e
        ttft = (self.first_token_ns - self.arrival_ns) / 1e9
        itl = (self.last_token_ns - self.first_token_ns) / 1e9 / (tokens - 1) if tokens > 1 else None
        return ttft, itl, e2e

    def blocks(self, generated: int) -> int:
        """Blocks the request's sequence spans in the LLM."""
        return -(-(self.prompt_tokens + generated) // max(1, self.block_tokens))

    def reused_blocks(self) -> int:
        """Blocks of the prompt the LLM found cached, whole blocks only (as the engine counts them)."""
        return self.cached_tokens // max(1, self.block_tokens)


class TextStream:
    """Rounds of tokens in, the client's text out: end_id ends the text, stop strings end it (and are
    not sent), streamed requests get each round's new text as a chunk, others all of it at the end."""

    def __init__(self, greq: GenerationRequest, tokenizer: Tokenizer, end_id: int | None,
                 perf: RequestPerf | None = None) -> None:
        self.greq = greq
        self.tokenizer = tokenizer
        self.end_id = end_id
        self.perf = perf or RequestPerf(time.time_ns())
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopStringMatcher(greq.stop_words)
        self.stats = DecodeStats()
        self.finish_reason = "length"
        self.pending = ""  # text not yet sent (all of it when not streaming)
        self.log_probs: list[float] = []
        self.log_prob_tokens: list[int] = []  # the tokens they are of
        self.sent_log_probs = 0  # how many of them earlier responses carried

    def add(self, r: Round) -> bool:
        """Take a round's tokens; True when the request is done (last round, end_id or a stop string)."""
        self.stats.add(r)
        self.perf.token_arrived()
        self.perf.cached_tokens = max(self.perf.cached_tokens, r.cached_tokens)
        if r.log_probs is not None:
            self.log_probs += r.log_probs
            self.log_prob_tokens += r.tokens[: len(r.log_probs)]
        tokens = r.tokens
        if self.end_id in tokens:
            tokens = tokens[: tokens.index(self.end_id)]
            self.finish_reason = "stop"
        self.pending += self.stops.feed(self.detok.push(tokens))
        if self.stops.stopped:
            self.finish_reason = "stop"
        return r.last or self.stops.stopped

    def chunk(self) -> str:
        """For a streamed request: the text to send now ('' if none, or not streaming)."""
        if not self.greq.stream:
            return ""
        text, self.pending = self.pending, ""
        return text

    def final(self) -> str:
        """The last response's text: what is left, with the prompt in front for a non-streamed
        request that did not ask to exclude it."""
        if not self.stops.stopped:
            self.pending += self.stops.feed(self.detok.flush()) + self.stops.flush()
        text, self.pending = self.pending, ""
        if not self.greq.stream and not self.greq.exclude_input_in_output:
            text = self.greq.text + text
        return text


def response_arrays(greq: GenerationRequest, text: str, stream: TextStream,
                    finish_reason: str | None) -> dict[str, np.ndarray]:
    """A response's output tensors: tensorrt_llm_bls's (one sequence, so batch and sequence index 0;
    the perf outputs when asked), plus the prompt's token count and its tokens found cached (an OpenAI
    answer's usage), finish_reason and the speculation metrics. Each is [batch = 1, its dims in the
    model's config], as tensorrt_llm_bls sends them (its end-to-end client reads a perf output as
    [0][0]); text_output alone is [1], as tensorrt_llm_bls sends it (its postprocessing model's string
    per sequence; the client reads [0])."""
    stats, perf = stream.stats, stream.perf

    def one(value, dtype) -> np.ndarray:  # config dims [1]: [batch, 1]
        return np.array([[value]], dtype=dtype)

    out = {
        "text_output": np.array([text.encode("utf-8")], dtype=np.object_),
        "num_output_tokens": one(stats.emitted_tokens, np.int32),
        "num_input_tokens": one(perf.prompt_tokens, np.int32),
        "num_cached_tokens": one(perf.cached_tokens, np.int32),
        "batch_index": one(0, np.int32),
        "sequence_index": one(0, np.int32),
    }
    if finish_reason is not None:
        out["finish_reason"] = one(finish_reason.encode(), np.object_)
    if greq.return_log_probs:  # the tokens' since the previous response, and the sum of all so far
        start, stream.sent_log_probs = stream.sent_log_probs, len(stream.log_probs)
        tokens = [stream.tokenizer.decode([t]).encode("utf-8") for t in stream.log_prob_tokens[start:]]
        out["output_log_probs"] = np.array([[stream.log_probs[start:]]], dtype=np.float32)
        out["output_tokens"] = np.array([tokens], dtype=np.object_).reshape(1, -1)
        out["cum_log_probs"] = one(sum(stream.log_probs), np.float32)
    if greq.return_perf_metrics:
        blocks, reused = perf.blocks(stats.emitted_tokens), perf.reused_blocks()
        out |= {
            "acceptance_rate": one(stats.acceptance_rate, np.float32),
            "total_accepted_draft_tokens": one(stats.accepted_tokens, np.int32),
            "total_draft_tokens": one(stats.draft_tokens, np.int32),
            "num_rounds": one(stats.rounds, np.int32),
            "num_llm_calls": one(stats.llm_calls, np.int32),
            "draft_lengths": np.array(stats.call_draft_lengths, dtype=np.int32).reshape(1, -1),
            "num_pipelined_drafts": one(stats.pipelined_drafts, np.int32),
            "kv_cache_alloc_new_blocks": one(blocks - reused, np.int32),
            "kv_cache_reused_blocks": one(reused, np.int32),
            "kv_cache_alloc_total_blocks": one(blocks, np.int32),
            "arrival_time_ns": one(perf.arrival_ns, np.int64),
            "first_scheduled_time_ns": one(perf.scheduled_ns, np.int64),
            "first_token_time_ns": one(perf.first_token_ns, np.int64),
            "last_token_time_ns": one(perf.last_token_ns, np.int64),
        }
    return out
