"""A transformers causal LM as an engine: generation and draft verification, batched across requests.

This is the CPU stand-in for a TensorRT-LLM engine. Each sequence (request id) keeps its own KV cache;
every call computes only the tokens past the longest common prefix of what is cached and what is sent,
and KV of rejected draft tokens is cropped away at once, so only the accepted prefix survives. Across
requests the caches are a prefix cache: a finished sequence's KV is stored (stored_prefixes.py, within
`prefix_cache_bytes`), and a new request starts from the longest prefix it shares with a stored or live
sequence (taking over a stored one no longer than its input, copying the prefix otherwise), so
a repeated prompt or a conversation's next turn prefills only what is new.

Every call is a job (torch_jobs.py) that `step` advances by one forward pass over all the jobs it is
given (packed_forward.py); InflightTorchEngine (torch_inflight.py) steps every live call so, taking new
calls in before each pass, and `generate_batch` steps the calls it is given until all are done.
Verification of ragged drafts and plain decoding steps share the pass, so `off` batches exactly like
speculation. A KV budget in bytes bounds the caches: least recently used
sequences outside the batch are evicted before it would be exceeded (they are recomputed if they
return), and a batch that cannot fit alone is refused.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.sampling import request_randomness
from minions.decoding.tokens import common_prefix_len, longest_shared
from minions.engines.api import WARM_UP_TOKENS, BatchStats, SplitBatchEngine
from minions.engines.cuda_graphs import cuda_graph_runner
from minions.engines.packed_forward import ForwardBackend, ForwardRow, PackedLlamaForward, forward_backend
from minions.engines.prefix_cache import PrefixCacheStats
from minions.engines.sequence_cache import CachedSequence, SequenceCache
from minions.engines.stored_prefixes import StoredPrefixes
from minions.engines.torch_jobs import TorchJob
from minions.errors import InvalidRequest

log = logging.getLogger(__name__)


class TorchEngine(SplitBatchEngine):
    """A BatchEngine, MeteredEngine and PrefixCachingEngine (engines/api.py) over a transformers model,
    and the Stepper (inflight_batching.py) that InflightTorchEngine (torch_inflight.py) batches in flight.
    `prefix_caching` false: every new request is computed from scratch and nothing is stored."""

    def __init__(
        self,
        model,
        max_sequences: int = 8,
        max_context: int | None = None,
        min_forward_tokens: int = 1,
        kv_budget_bytes: int | None = None,
        prefix_caching: bool = True,
        prefix_cache_bytes: int = 0,
        graph_rows: int = 0,
        graph_draft_tokens: int = 16,
        graph_memory_bytes: int = 0,
    ) -> None:
        """`graph_rows` > 0 on CUDA: steps of up to that many rows, drafts of up to `graph_draft_tokens`,
        run as CUDA graphs captured at load within `graph_memory_bytes` (cuda_graphs.py); the KV pool is
        then sized for the KV budget at once, as graphs hold its tensors."""
        self.model = model.eval()
        on_cuda = next(model.parameters()).device.type == "cuda"
        graphs = graph_rows > 0 and on_cuda and kv_budget_bytes is not None
        self.backend: ForwardBackend = forward_backend(self.model, kv_budget_bytes if graphs else 0)
        # Passes of 2..min_forward_tokens-1 rows are padded up to min_forward_tokens: on this CPU's
        # MKL a 2-3 row matmul is slower than a 4-row one. Pads follow the last row's real tokens, so
        # causal attention keeps them out of the real rows; their KV is cropped right after.
        self.min_forward_tokens = min_forward_tokens
        self.vocab_size = int(model.config.vocab_size)
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 2048))
        self.cache: SequenceCache = SequenceCache(max_sequences)
        self.kv_budget_bytes = kv_budget_bytes
        self.prefix_caching = prefix_caching
        self.stored = StoredPrefixes(prefix_cache_bytes if prefix_caching else 0)
        self._private: set[str] = set()
        """Live request ids that share no prefix (EngineRequest.shares_prefix false)."""
        self._lock = threading.Lock()
        self.stats = BatchStats()
        self.prefix_stats = PrefixCacheStats()
        self._warm_up()
        if graphs and isinstance(self.backend, PackedLlamaForward):
            self.backend.runner = cuda_graph_runner(self.backend, graph_rows, draft_tokens=graph_draft_tokens,
                                                    context=self.max_context, budget_bytes=graph_memory_bytes)
        self.stats, self.prefix_stats = BatchStats(), PrefixCacheStats()  # the warm-up is not served work

    # -- BatchEngine (generate, generate_batch: SplitBatchEngine) ----------------------------------
    def _generate_distinct(self, requests: list[EngineRequest]) -> list[EngineResult | Exception]:
        out: list[EngineResult | Exception | None] = [None] * len(requests)
        jobs: list[tuple[int, TorchJob]] = []
        for i, request in enumerate(requests):
            try:
                jobs.append((i, self.start(request)))
            except InvalidRequest as exc:
                out[i] = exc
        known = {job.request.request_id for _, job in jobs if job.request.request_id in self.cache}
        while jobs:
            try:
                done = self.step([job for _, job in jobs])
            except InvalidRequest as exc:
                for i, job in jobs:
                    out[i] = exc
                    if job.request.request_id not in known:  # a refused batch leaves no new sequence
                        self.drop(job.request.request_id)
                break
            for (i, job), finished in zip(jobs, done):
                if finished:
                    out[i] = job.error or job.result
            jobs = [(i, job) for (i, job), finished in zip(jobs, done) if not finished]
        return out  # type: ignore[return-value]

    # -- Stepper (inflight_batching.py) ------------------------------------------------------------
    def start(self, request: EngineRequest) -> TorchJob:
        """A call's job; InvalidRequest for one longer than the context."""
        total = len(request.input_ids) + max(request.request_output_len, len(request.draft) + 1)
        if total > self.max_context:
            raise InvalidRequest(f"sequence of {total} tokens exceeds the engine's context of {self.max_context}")
        return TorchJob(request, request_randomness(request.seed), list(request.input_ids))

    def step(self, jobs: list[TorchJob]) -> list[bool]:
        """One pass over every job; which are finished (a result, or an error of their own). A batch the
        KV budget cannot hold raises InvalidRequest for all of them."""
        with self._lock, torch.inference_mode():
            logits = self._forward_jobs(jobs)
            done = []
            for job, rows in zip(jobs, logits):
                try:
                    done.append(job.absorb(rows))
                except InvalidRequest as exc:
                    job.error = exc
                    done.append(True)
                if job.kept is not None:  # a verification keeps its accepted tokens' KV alone
                    self._crop(job.entry, job.kept)
            return done

    def partial(self, job: TorchJob) -> EngineResult | None:
        return job.partial()

    def result(self, job: TorchJob) -> EngineResult:
        return job.final()

    def drop(self, request_id: str) -> None:
        """Forget a sequence (a refused or failed step left it unknown): nothing is stored."""
        with self._lock:
            self.cache.release(request_id)
            self._private.discard(request_id)

    def release(self, request_id: str) -> None:
        """The request is done: its KV is stored for later requests (unless it shares none), else freed."""
        with self._lock:
            entry = self.cache.release(request_id)
            private = request_id in self._private
            self._private.discard(request_id)
            if entry is not None and entry.tokens and self.prefix_caching and not private:
                self.stored.add(entry.tokens, entry.state, self.backend.state_bytes(entry.state))

    @property
    def forward_tokens(self) -> int:
        """Real tokens computed so far (pads aside)."""
        return self.stats.tokens - self.stats.pad_tokens

    def cached_bytes(self) -> int:
        """Bytes the KV caches of every cached sequence hold, live or stored."""
        return sum(self.backend.state_bytes(e.state) for _, e in self.cache.items()) + self.stored.size()

    # -- internals ---------------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """A short generation at load, then forgotten: torch sets up its kernels on the first passes
        (SmolLM2 fp32 on this CPU: the first request took 0.76 s against 0.47 s for the next)."""
        request = EngineRequest("warm-up", [0] * min(WARM_UP_TOKENS, self.max_context - 2), 2)
        self._generate_distinct([request])
        self.cache.release(request.request_id)  # not stored: no request starts with it

    def _forward_jobs(self, jobs: list[TorchJob]) -> list[np.ndarray]:
        """One pass over every job's uncached tokens (+ its draft on a verification)."""
        rows = []
        for job in jobs:
            extra = job.draft if job.request.draft else []
            job.entry = self._entry(job.request, job.sequence)
            if job.cached is None:
                job.cached = self.backend.length(job.entry.state)
            rows.append((job.sequence, extra, len(extra) + 1))
        entries = [job.entry for job in jobs]
        forward_rows = [
            ForwardRow(entry.state, tokens[self.backend.length(entry.state):] + extra, n)
            for entry, (tokens, extra, n) in zip(entries, rows)
        ]
        real = sum(len(r.new_tokens) for r in forward_rows)
        pad = self.min_forward_tokens - real if 1 < real < self.min_forward_tokens else 0
        last = forward_rows[-1]
        last.new_tokens = last.new_tokens + [last.new_tokens[-1]] * pad
        last.n_logits += pad
        self._fit_budget(entries, forward_rows)
        logits = self.backend.forward(forward_rows)
        if pad:
            self.backend.crop(last.state, self.backend.length(last.state) - pad)
            logits[-1] = logits[-1][:-pad]
        for entry, (tokens, extra, _) in zip(entries, rows):
            entry.tokens = list(tokens) + list(extra)
        self.stats.passes += 1
        self.stats.sequences += len(jobs)
        self.stats.tokens += real + pad
        self.stats.pad_tokens += pad
        return logits

    def _entry(self, request: EngineRequest, tokens: list[int]) -> CachedSequence:
        """The request's cache, cropped to the longest prefix it shares with `tokens` (at least one token left)."""
        entry = self.cache.get(request.request_id)
        if entry is None:
            entry = self._start(request, tokens)
            self.cache.put(request.request_id, entry)
            return entry
        keep = min(common_prefix_len(entry.tokens, tokens), len(tokens) - 1)
        if keep == 0:
            entry.state, entry.tokens = self.backend.new_state(), []
        self._crop(entry, keep)
        return entry

    def _start(self, request: EngineRequest, tokens: list[int]) -> CachedSequence:
        """A new sequence's cache: the longest prefix of `tokens` (all but the last, evaluated for its
        logits) that a stored or live sequence holds. A stored one is taken over where it is no longer
        than the new input (a conversation's next turn), its buffers then no larger than the new
        sequence's own would grow (the orchestrator's KV admission counts each request's own tokens);
        otherwise the prefix is copied (a few milliseconds, where computing it takes seconds on a CPU),
        and the stored one stays for the next request (a prompt sent again and again)."""
        if not (self.prefix_caching and request.shares_prefix):
            self._private.add(request.request_id)
            return CachedSequence(self.backend.new_state(), [])
        stored, shared = self.stored.longest(tokens)
        live, from_live = self._longest_live(tokens)
        if from_live > shared:
            stored, shared = None, from_live
        shared = min(shared, len(tokens) - 1)
        self.prefix_stats.queries += len(tokens)
        self.prefix_stats.hits += max(shared, 0)
        if shared <= 0:
            return CachedSequence(self.backend.new_state(), [])
        if stored is not None and len(stored.tokens) <= len(tokens):
            entry = CachedSequence(self.stored.take(stored).blob, stored.tokens)
            self._crop(entry, shared)
            return entry
        if stored is not None:
            self.stored.touch(stored)
        donor = stored.blob if stored is not None else live.state
        return CachedSequence(self.backend.copy_prefix(donor, shared), list(tokens[:shared]))

    def _longest_live(self, tokens: list[int]) -> tuple[CachedSequence | None, int]:
        """The live sequence (sharing prefixes) with the most leading tokens in common with `tokens`."""
        return longest_shared(((entry, entry.tokens[:self.backend.length(entry.state)])
                               for request_id, entry in self.cache.items() if request_id not in self._private),
                              tokens)

    def _fit_budget(self, entries: list[CachedSequence], rows: list[ForwardRow]) -> None:
        """Evict stored prefixes, then least recently used sequences outside the batch, until the batch's
        growth fits the budget."""
        if self.kv_budget_bytes is None:
            return
        needed = sum(self.backend.projected_bytes(r.state, self.backend.length(r.state) + len(r.new_tokens))
                     for r in rows)
        if needed > self.kv_budget_bytes:
            raise InvalidRequest(f"the batch needs {needed} bytes of KV cache; the engine's budget is "
                                 f"{self.kv_budget_bytes}")
        in_batch = {id(e) for e in entries}
        others = [(rid, e) for rid, e in self.cache.items() if id(e) not in in_batch]
        held = sum(self.backend.state_bytes(e.state) for _, e in others) + self.stored.size()
        while held + needed > self.kv_budget_bytes and (stored := self.stored.pop_oldest()) is not None:
            held -= stored.size
        while others and held + needed > self.kv_budget_bytes:
            request_id, entry = others.pop(0)
            held -= self.backend.state_bytes(entry.state)
            log.info("KV budget of %d bytes: evicting %s", self.kv_budget_bytes, request_id)
            self.cache.evict(request_id)
            self._private.discard(request_id)

    def _crop(self, entry: CachedSequence, length: int) -> None:
        self.backend.crop(entry.state, length)
        entry.tokens = entry.tokens[: min(length, self.backend.length(entry.state))]

