"""A GGUF model run by llama.cpp as an engine, batched across requests: the LLM's verifier, a plain
decoder, or a cheap self-draft.

One llama.cpp context holds up to `max_sequences` sequences (a sequence id each, in one unified KV
buffer or, with `kv_unified` false, a stream of cells each); a request keeps its slot while it lives.
Each call rewinds the slot to the longest common prefix of what it holds and what it is sent and
evaluates only the rest. Across requests the slots are a prefix cache (prefix_cache.py keeps the books,
llamacpp_cells.py moves the cells): a finished request's KV cells are copied to host memory and cleared
(`prefix_cache_ram_mib`; with 0 its slot stays as an idle prefix instead, which slows every step of the
others), and a new request starts with the cells of the longest cached prefix, so a re-sent
conversation or file is not prefilled again.

Calls are batched in flight: each llama.cpp decode step carries the pending tokens of every call in
progress: one token of each generation, and the uncached tail plus the whole draft of each
verification (logits at every draft position, so a ragged batch of drafts costs its tokens, no
padding); uncached prompt tokens beyond the step's n_batch go in chunks over later steps, oldest call
first. A verification finishes in the step that evaluates its draft: the draft is judged
(decoding/verification.py) and the KV cells of rejected tokens are removed at once. Calls that
arrive meanwhile join at the next step, so b calls of s tokens cost about s steps instead of b * s.
A streaming generation reports each token as it is made (inflight_batching.py sends it on).
"""

from __future__ import annotations

import contextlib
import numpy as np

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.sampling import request_randomness
from minions.decoding.tokens import common_prefix_len
from minions.decoding.verification import verify_draft
from minions.engines.api import WARM_UP_TOKENS, BatchStats
from minions.engines.batched_calls import BatchedCalls
from minions.engines.inflight_batching import InflightBatcher
from minions.engines.llamacpp_cells import SlotCells
from minions.engines.llamacpp_job import LlamaCppJob
from minions.engines.llamacpp_setup import context_params, model_params, require_batch_invariance
from minions.engines.prefix_cache import PrefixCache
from minions.engines.step_lock import StepLock, step_slots
from minions.errors import InvalidRequest

INVARIANCE_CHECK_CELLS, INVARIANCE_CHECK_TOKENS = 64, 3
"""A batch-invariant stepper's load-time check: 64 tokens in one step, then the last 3 of them one at a time
on the first 61 (where a step of 16 did not tell a model run without the setting from one with it)."""


class LlamaCppEngine(BatchedCalls):
    """An InflightEngine and MeteredEngine (engines/api.py): every call, batched or submitted, goes
    through an in-flight batcher, so it joins the drafts already running at their next decode step
    instead of waiting for them to finish (inflight_batching.py)."""

    def __init__(
        self,
        model_path: str,
        num_threads: int = 2,
        max_sequences: int = 4,
        n_ctx: int = 2048,
        draft_min_prob: float = 0.0,
        n_batch: int = 512,
        prefix_caching: bool = True,
        prefix_cache_ram_mib: float = 0,
        kv_unified: bool = True,
        batch_invariant: bool = False,
        step_lock_path: str | None = None,
    ) -> None:
        """`step_lock_path`: a file every instance of the model shares (step_lock.py), so that a reload's
        old and new instance take turns step by step instead of computing at once."""
        self.step_lock = StepLock(step_lock_path, step_slots(num_threads)) if step_lock_path else None
        self.stepper = LlamaCppStepper(model_path, num_threads=num_threads, max_sequences=max_sequences, n_ctx=n_ctx,
                                       draft_min_prob=draft_min_prob, n_batch=n_batch, prefix_caching=prefix_caching,
                                       stored_bytes=int(prefix_cache_ram_mib * 2**20), kv_unified=kv_unified,
                                       batch_invariant=batch_invariant, step_lock=self.step_lock)
        self.cache = self.stepper.slots.live
        self.stats = self.stepper.stats  # passes = llama.cpp decode calls
        self.prefix_stats = self.stepper.slots.stats
        self.n_vocab = self.stepper.n_vocab
        # Warmed up on the batcher's thread: OpenMP keeps a thread team per thread (docs/engines.md).
        self.batcher: InflightBatcher[LlamaCppJob] = InflightBatcher(self.stepper, max_sequences, name="llamacpp",
                                                                     prepare=self.stepper.warm_up)

    def close(self) -> None:
        self.batcher.close()
        if self.step_lock is not None:
            self.step_lock.close()

    def cached_bytes(self) -> None:
        """Unknown: llama.cpp allocates one KV buffer for every slot at load."""
        return None


class LlamaCppStepper:
    """One llama.cpp context and the decode steps over it; used from the batcher's thread only."""

    def __init__(self, model_path: str, *, num_threads: int, max_sequences: int, n_ctx: int,
                 draft_min_prob: float, n_batch: int, prefix_caching: bool, stored_bytes: int = 0,
                 kv_unified: bool = True, batch_invariant: bool = False, step_lock: StepLock | None = None) -> None:
        from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's load and context logs: errors only

        # Greedy drafting stops early once the model's own top-1 probability falls below this:
        # an unsure draft token is likely rejected, and each one costs a full llama.cpp step.
        self.draft_min_prob = draft_min_prob
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.kv_unified = kv_unified
        self.batch_invariant = batch_invariant
        self.slots = PrefixCache(max_sequences, enabled=prefix_caching, stored_bytes=stored_bytes)
        self._stepping: set[str] = set()  # ids with a call in progress: their slots are never evicted
        if batch_invariant:
            require_batch_invariance()
        # Loaded eagerly so that a bad path fails at model load.
        self._model = LlamaModel(path_model=model_path, params=model_params(batch_invariant), verbose=False)
        params = context_params(max_sequences, n_ctx, n_batch=n_batch, num_threads=num_threads, kv_unified=kv_unified,
                                batch_invariant=batch_invariant)
        self._ctx = LlamaContext(model=self._model, verbose=False, params=params)
        self.cells = SlotCells(self._ctx, self.slots, kv_unified)
        self._batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = self._model.n_vocab()
        self.stats = BatchStats()  # passes = llama.cpp decode calls
        self._step_lock = step_lock if step_lock is not None else contextlib.nullcontext()

    # -- Stepper protocol --------------------------------------------------------------------------
    def start(self, request: EngineRequest) -> LlamaCppJob:
        draft = request.draft[: max(request.request_output_len - 1, 0)]
        total = len(request.input_ids) + max(request.request_output_len, len(draft) + 1)
        if total > self.n_ctx:
            raise InvalidRequest(f"sequence of {total} tokens exceeds the context of {self.n_ctx}")
        sequence = list(request.input_ids)
        entry = self.cells.slot_for(request, sequence, busy=self._stepping)
        keep = min(common_prefix_len(entry.tokens, sequence), len(sequence) - 1)
        self.cells.trim(entry.state, keep)
        entry.tokens = sequence[:keep]
        self._stepping.add(request.request_id)  # last: a start that raised leaves no pinned slot
        return LlamaCppJob(request, entry, sequence=sequence, pending=sequence[keep:] + draft,
                           rng=request_randomness(request.seed), draft=draft, cached=keep)

    def step(self, jobs: list[LlamaCppJob]) -> list[bool]:
        """One decode step: every job's pending tokens in, long prompts in chunks (`_takes`); which jobs
        are finished. A job whose prompt is not all in yet waits for a later step."""
        if not self.kv_unified:
            self.cells.close_gaps(job.entry for job in jobs)
        rows = self._decode(jobs, self._takes(jobs))
        return [not job.pending and self._absorb(job, row) for job, row in zip(jobs, rows)]

    def partial(self, job: LlamaCppJob) -> EngineResult | None:
        """The tokens a streaming job made since the last call (None: nothing new)."""
        new = job.tokens[job.streamed:]
        if not new:
            return None
        rows = np.stack(job.rows[job.streamed:]) if job.rows else None
        result = EngineResult(new, logits=rows, log_probs=self._log_probs(job), final=False, cached_tokens=job.cached)
        job.streamed = len(job.tokens)
        return result

    def result(self, job: LlamaCppJob) -> EngineResult:
        """What is left to answer: every token, or for a streaming job those not yet reported."""
        self._stepping.discard(job.request.request_id)
        if job.error is not None:
            raise job.error
        rows = job.rows[job.streamed:]
        return EngineResult(job.tokens[job.streamed:], logits=np.stack(rows) if rows else None,
                            log_probs=self._log_probs(job), cached_tokens=job.cached)

    @staticmethod
    def _log_probs(job: LlamaCppJob) -> list[float] | None:
        return job.log_probs[job.streamed:] if job.request.return_log_probs else None

    def release(self, request_id: str) -> None:
        """The request is done: its cells go to host memory (or its slot stays as an idle prefix)."""
        self._stepping.discard(request_id)
        self.cells.finish(request_id)

    def drop(self, request_id: str) -> None:
        """Forget a sequence whose cells are unknown after a failed step: its slot is cleared."""
        self._stepping.discard(request_id)
        self.cells.drop(request_id)

    # -- internals ---------------------------------------------------------------------------------
    def warm_up(self, tokens: int = WARM_UP_TOKENS) -> None:
        """Decode a few tokens at load and forget them, as llama-server does (docs/engines.md, "Warm-up at
        load"), on the thread that steps. A batch-invariant stepper does so by checking the loaded model
        (`invariance_mismatch`), refusing to load where it fails (require_batch_invariance checked the build)."""
        if not self.batch_invariant:
            ids = self._throwaway(tokens)
            self._decode_alone(ids, start=0, logits_from=len(ids) - 1)
            self._ctx.kv_cache_clear()
        elif mismatch := self.invariance_mismatch(max(tokens, INVARIANCE_CHECK_CELLS), INVARIANCE_CHECK_TOKENS):
            raise ValueError(f"batch_invariant: {mismatch}: outputs could differ from plain decoding; set "
                             "batch_invariant: false for this model in the deployment")

    def invariance_mismatch(self, cells: int, checked: int) -> str | None:
        """Decode `cells` throwaway tokens in one step, then again with the last `checked` of them one at a
        time, and forget them all; where a token's logits differ between the two, which and by how much."""
        ids = self._throwaway(cells)
        together = self._decode_alone(ids, start=0, logits_from=len(ids) - checked)
        self._ctx.kv_cache_clear()
        try:
            self._decode_alone(ids[:-checked], start=0, logits_from=len(ids))
            for j, want in zip(range(len(ids) - checked, len(ids)), together):
                alone = self._decode_alone([ids[j]], start=j, logits_from=0)[0]
                if not np.array_equal(alone, want):
                    return (f"the loaded model's logits at position {j} differ decoded alone and in a step of "
                            f"{len(ids)} (by up to {float(np.abs(alone - want).max()):.3g})")
            return None
        finally:
            self._ctx.kv_cache_clear()

    def _throwaway(self, n: int) -> list[int]:  # distinct token ids, at most a batch's worth
        return [(7919 * (j + 1)) % self.n_vocab for j in range(min(n, self.n_batch))]

    def _decode_alone(self, tokens: list[int], start: int, logits_from: int) -> list[np.ndarray]:
        """Decode `tokens` at positions `start`... of sequence 0 in one step; their logits from `logits_from` on."""
        self._step([(0, start + j, token, j >= logits_from) for j, token in enumerate(tokens)])
        return [np.ctypeslib.as_array(self._ctx.get_logits_ith(j), shape=(self.n_vocab,)).copy()
                for j in range(logits_from, len(tokens))]

    def _step(self, cells: list[tuple[int, int, int, bool]]) -> None:
        """One llama.cpp decode of `cells` (sequence, position, token, whether its logits are wanted),
        holding the model's step lock (engines/step_lock.py): every decode of this context goes through here."""
        batch = self._batch.batch
        for j, (sequence, pos, token, wanted) in enumerate(cells):
            batch.token[j] = token
            batch.pos[j] = pos
            batch.seq_id[j][0] = sequence
            batch.n_seq_id[j] = 1
            batch.logits[j] = wanted
        batch.n_tokens = len(cells)
        with self._step_lock:
            self._ctx.decode(self._batch)

    def _takes(self, jobs: list[LlamaCppJob]) -> list[int]:
        """How many of each job's pending tokens this step evaluates. Every job's logit positions (its
        next token, its draft) go in; the uncached prompt tokens before them share what is left of
        n_batch, oldest job first, a prompt that does not fit going in part (at least a quarter of
        n_batch a step). So, as in llama-server's batches, a long prompt does not hold up every other
        request's next token, and prompts that arrive together start streaming one after another
        instead of all after the last one's prefill."""
        budget = max(self.n_batch - sum(min(len(job.pending), job.logit_rows) for job in jobs), self.n_batch // 4)
        takes = []
        for job in jobs:
            prefix = max(len(job.pending) - job.logit_rows, 0)
            take = len(job.pending) if prefix <= budget else budget
            budget -= min(take, prefix)
            takes.append(take)
        return takes

    def _decode(self, jobs: list[LlamaCppJob], takes: list[int]) -> list[list[np.ndarray]]:
        """Evaluate the first `takes` pending tokens of each job (in chunks of n_batch); the logits of
        its last `logit_rows` tokens, for a job whose pending tokens all went in."""
        ordered = sorted(zip(jobs, takes), key=lambda pair: pair[0].entry.state)
        items = [(job, pos, token, i >= len(job.pending) - job.logit_rows)
                 for job, take in ordered
                 for i, (pos, token) in enumerate(enumerate(job.pending[:take], start=len(job.entry.tokens)))]
        rows: dict[int, list[np.ndarray]] = {id(job): [] for job in jobs}
        for start in range(0, len(items), self.n_batch):
            chunk = items[start : start + self.n_batch]
            self._step([(job.entry.state, pos, token, wanted) for job, pos, token, wanted in chunk])
            self.stats.passes += 1
            self.stats.sequences += len({id(job) for job, _, _, _ in chunk})
            self.stats.tokens += len(chunk)
            for j, (job, _, _, wanted) in enumerate(chunk):
                if wanted:
                    logits = np.ctypeslib.as_array(self._ctx.get_logits_ith(j), shape=(self.n_vocab,))
                    rows[id(job)].append(logits.copy())
        for job, take in zip(jobs, takes):
            job.entry.tokens = job.entry.tokens + job.pending[:take]
            job.pending = job.pending[take:]
        return [rows[id(job)] for job in jobs]

    def _absorb(self, job: LlamaCppJob, rows: list[np.ndarray]) -> bool:
        """Apply a step's logits to a job; True when the job is finished."""
        if job.draft:
            return self._verify(job, np.stack(rows))
        logits = rows[-1]
        request = job.request
        token = request.next_token(logits, job.sequence, job.rng)
        if job.tokens and self._unsure(logits, token, request):
            return True
        job.tokens.append(token)
        job.sequence.append(token)
        if request.return_generation_logits:
            job.rows.append(logits)
        job.log_probs += request.log_probs([logits], [token]) or []
        done = request.generation_done(job.tokens)
        if not done:
            job.pending = [token]
        return done

    def _verify(self, job: LlamaCppJob, logits: np.ndarray) -> bool:
        """Judge the draft against its logit rows and remove the rejected tokens' KV cells."""
        request = job.request
        try:
            verdict = verify_draft(logits, job.draft, params=request.sampling, rng=job.rng, context=request.input_ids,
                                   bad_words=request.bad_words, end_id=request.end_id,
                                   draft_logits=request.draft_logits, penalties=request.penalties)
        except ValueError as exc:  # draft_logits that do not fit the draft or the vocabulary
            job.error = InvalidRequest(str(exc))
            return True
        keep = len(request.input_ids) + verdict.num_accepted
        self.cells.trim(job.entry.state, keep)
        job.entry.tokens = job.entry.tokens[:keep]
        job.tokens = verdict.tokens
        job.log_probs = request.log_probs(logits, verdict.tokens) or []
        if request.return_generation_logits:
            job.rows = list(logits[: len(verdict.tokens)])
        return True

    def _unsure(self, logits: np.ndarray, token: int, request: EngineRequest) -> bool:
        if self.draft_min_prob <= 0.0 or not request.sampling.greedy:
            return False
        shifted = np.exp(logits - logits[token])  # logits[token] is the max when greedy
        return 1.0 / float(shifted.sum()) < self.draft_min_prob
