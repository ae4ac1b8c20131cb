"""A GGUF model run by llama.cpp as an engine (the cheap quantised self-draft `ssm_q4`), batched across requests.

One llama.cpp context holds up to `max_sequences` sequences, each in its own KV stream (a sequence id);
a request keeps its slot while it lives (LRU beyond that). Each call rewinds the slot to the longest
common prefix of what it holds and what it is sent and evaluates only the rest.

`generate_batch` drafts for every request Triton's dynamic batcher hands over together: each llama.cpp
decode step carries one token of every sequence still drafting (and the uncached prompt tails on the
first step), so a batch of b drafts of s tokens costs s decode steps instead of b * s. Measured on this
machine with one thread, 200-token contexts: 8.5 ms/token at 8 sequences, 6.9 at 16, 13.6 for one.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import numpy as np

from .engine_api import BatchEngine, BatchStats, EngineRequest, EngineResult
from .errors import InvalidRequest
from .sequence_cache import CachedSequence, SequenceCache, common_prefix_len

log = logging.getLogger(__name__)


@dataclass
class _Draft:
    """One request inside a batch: its slot, the tokens still to evaluate, and what it has drafted."""

    index: int
    request: EngineRequest
    entry: CachedSequence[int]
    sequence: list[int]
    pending: list[int]
    rng: np.random.Generator
    tokens: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)


class LlamaCppEngine(BatchEngine):
    def __init__(
        self,
        model_path: str,
        num_threads: int = 2,
        max_sequences: int = 4,
        n_ctx: int = 2048,
        draft_min_prob: float = 0.0,
        n_batch: int = 512,
    ) -> None:
        from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's load and context logs: errors only

        # Greedy drafting stops early once the model's own top-1 probability falls below this:
        # an unsure draft token is likely rejected, and each one costs a full llama.cpp step.
        self.draft_min_prob = draft_min_prob
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.cache: SequenceCache[int] = SequenceCache(max_sequences)
        self._free_slots = list(range(max_sequences))
        self._lock = threading.Lock()
        # Loaded eagerly so that a bad path fails at model load.
        self._model = LlamaModel(path_model=model_path, params=LlamaModel.default_params(), verbose=False)
        params = LlamaContext.default_params()
        params.n_seq_max = max_sequences
        # One KV buffer shared by every sequence. With a stream per sequence (kv_unified = False)
        # llama.cpp splits a step into one ubatch per run of consecutive sequence ids, so the drafts
        # of a batch ran one after another: 12.6 ms/token at 8 sequences against 7.5 when their ids
        # happened to be consecutive (README, ssm_q4 batching). Unified, any sequences share a ubatch;
        # flash attention (llama.cpp's default here) skips the cells of the other sequences.
        params.kv_unified = True
        params.n_ctx = n_ctx * max_sequences  # each sequence is held to n_ctx by the checks below
        params.n_batch = params.n_ubatch = n_batch
        params.n_threads = params.n_threads_batch = num_threads
        self._ctx = LlamaContext(model=self._model, params=params, verbose=False)
        self._batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = self._model.n_vocab()
        self.stats = BatchStats()  # passes = llama.cpp decode calls

    # -- Engine protocol (generate, generate_batch: BatchEngine) -----------------------------------
    def release(self, request_id: str) -> None:
        with self._lock:
            self._forget(request_id)

    # -- internals ---------------------------------------------------------------------------------
    def _generate_distinct(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]:
        out: list[EngineResult | Exception | None] = [None] * len(requests)
        valid = []
        for i, request in enumerate(requests):
            if request.draft:
                out[i] = InvalidRequest("this engine drafts only: draft_input_ids are not supported")
            elif len(request.input_ids) + request.request_output_len > self.n_ctx:
                out[i] = InvalidRequest(f"sequence of {len(request.input_ids) + request.request_output_len} "
                                        f"tokens exceeds the context of {self.n_ctx}")
            else:
                valid.append(i)
        # No more sequences at once than there are slots: a batch never evicts one of its own.
        for start in range(0, len(valid), self.cache.capacity):
            part = valid[start : start + self.cache.capacity]
            try:
                with self._lock:
                    drafts = [self._start(i, requests[i]) for i in part]
                    self._run(drafts)
                for d in drafts:
                    out[d.index] = EngineResult(d.tokens, 0, np.stack(d.rows) if d.rows else None)
            except Exception as exc:  # llama.cpp refusing a decode fails this part, not the model
                log.exception("llama.cpp batch of %d failed", len(part))
                for i in part:
                    out[i] = exc
                with self._lock:  # what the slots hold is unknown now: recompute from scratch next time
                    for i in part:
                        self._forget(requests[i].request_id)
        return out  # type: ignore[return-value]

    def _start(self, index: int, request: EngineRequest) -> _Draft:
        entry = self._slot_for(request.request_id)
        sequence = list(request.input_ids)
        keep = min(common_prefix_len(entry.tokens, sequence), len(sequence) - 1)
        self._ctx.kv_cache_seq_rm(entry.state, keep, -1)
        entry.tokens = sequence[:keep]
        return _Draft(index, request, entry, sequence, sequence[keep:], np.random.default_rng(request.seed))

    def _run(self, drafts: list[_Draft]) -> None:
        """Decode steps until every draft is done: each step evaluates every active draft's pending tokens."""
        active = drafts
        while active:
            logits = self._decode(active)
            still = []
            for d, row in zip(active, logits):
                if not self._absorb(d, row):
                    still.append(d)
            active = still

    def _decode(self, drafts: list[_Draft]) -> list[np.ndarray]:
        """Evaluate each draft's pending tokens (in chunks of n_batch); the logits of each one's last token."""
        items = [(d, pos, token) for d in drafts
                 for pos, token in enumerate(d.pending, start=len(d.entry.tokens))]
        last: dict[int, np.ndarray] = {}
        batch = self._batch.batch
        for start in range(0, len(items), self.n_batch):
            chunk = items[start : start + self.n_batch]
            for j, (d, pos, token) in enumerate(chunk):
                batch.token[j] = token
                batch.pos[j] = pos
                batch.seq_id[j][0] = d.entry.state
                batch.n_seq_id[j] = 1
                batch.logits[j] = pos == len(d.entry.tokens) + len(d.pending) - 1
            batch.n_tokens = len(chunk)
            self._ctx.decode(self._batch)
            self.stats.passes += 1
            self.stats.sequences += len({id(d) for d, _, _ in chunk})
            self.stats.tokens += len(chunk)
            for j, (d, pos, _) in enumerate(chunk):
                if batch.logits[j]:
                    last[id(d)] = np.ctypeslib.as_array(self._ctx.get_logits_ith(j), shape=(self.n_vocab,)).copy()
        for d in drafts:
            d.entry.tokens = d.entry.tokens + d.pending
            d.pending = []
        return [last[id(d)] for d in drafts]

    def _absorb(self, d: _Draft, logits: np.ndarray) -> bool:
        """Pick the next draft token from a step's logits; True when the draft is finished."""
        request = d.request
        token = request.next_token(logits, d.sequence, d.rng)
        if d.tokens and self._unsure(logits, token, request):
            return True
        d.tokens.append(token)
        d.sequence.append(token)
        if request.return_generation_logits:
            d.rows.append(logits)
        done = request.generation_done(d.tokens)
        if not done:
            d.pending = [token]
        return done

    def _unsure(self, logits: np.ndarray, token: int, request: EngineRequest) -> bool:
        if self.draft_min_prob <= 0.0 or not request.sampling.greedy:
            return False
        shifted = np.exp(logits - logits[token])  # logits[token] is the max when greedy
        return 1.0 / float(shifted.sum()) < self.draft_min_prob

    def _slot_for(self, request_id: str) -> CachedSequence[int]:
        entry = self.cache.get(request_id)
        if entry is not None:
            return entry
        if len(self.cache) >= self.cache.capacity:
            self._free(self.cache.pop_oldest())
        entry = CachedSequence(self._free_slots.pop(), [])
        self.cache.put(request_id, entry)
        return entry

    def _forget(self, request_id: str) -> None:
        entry = self.cache.release(request_id)
        if entry is not None:
            self._free(entry)

    def _free(self, entry: CachedSequence[int]) -> None:
        self._ctx.kv_cache_seq_rm(entry.state, -1, -1)
        self._free_slots.append(entry.state)
