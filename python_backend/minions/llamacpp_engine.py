"""A GGUF model run by llama.cpp as an engine (the cheap quantised self-draft `ssm_q4`).

llama.cpp contexts hold one sequence each, so the engine keeps a small pool of contexts, one per live
request (LRU beyond that); each call rewinds the context to the longest common prefix of what it holds
and what it is sent, evaluates only the rest, then generates `request_output_len` tokens.
"""

from __future__ import annotations

import threading

import numpy as np

from .engine_api import EngineRequest, EngineResult
from .errors import InvalidRequest
from .sampling import pick_token
from .sequence_cache import CachedSequence, SequenceCache, common_prefix_len


class LlamaCppEngine:
    def __init__(
        self,
        model_path: str,
        num_threads: int = 2,
        max_sequences: int = 4,
        n_ctx: int = 2048,
        draft_min_prob: float = 0.0,
    ) -> None:
        self.model_path = model_path
        # Greedy drafting stops early once the model's own top-1 probability falls below this:
        # an unsure draft token is likely rejected, and each one costs a full llama.cpp step.
        self.draft_min_prob = draft_min_prob
        self.num_threads = num_threads
        self.n_ctx = n_ctx
        self.cache: SequenceCache = SequenceCache(max_sequences)
        self._idle: list = []
        self._lock = threading.Lock()
        self._idle.append(self._new_context())  # load eagerly so a bad path fails at model load

    def _new_context(self):
        from llama_cpp import Llama

        return Llama(
            model_path=self.model_path,
            n_ctx=self.n_ctx,
            n_batch=512,
            n_threads=self.num_threads,
            n_threads_batch=self.num_threads,
            logits_all=False,
            verbose=False,
        )

    def generate(self, request: EngineRequest) -> EngineResult:
        if request.stop:
            self.release(request.request_id)
            return EngineResult([])
        if request.draft:
            raise InvalidRequest("this engine drafts only: draft_input_ids are not supported")
        n = request.request_output_len
        if len(request.input_ids) + n > self.n_ctx:
            raise InvalidRequest(f"sequence of {len(request.input_ids) + n} tokens exceeds the context of {self.n_ctx}")
        rng = np.random.default_rng(request.seed)
        with self._lock:
            entry = self._context_for(request.request_id)
            ctx = entry.state
            sequence = list(request.input_ids)
            keep = min(common_prefix_len(entry.tokens, sequence), len(sequence) - 1)
            ctx.n_tokens = keep
            ctx.eval(sequence[keep:])
            tokens: list[int] = []
            rows: list[np.ndarray] = []
            for i in range(n):
                logits = _last_logits(ctx)
                banned = request.bad_words.banned_next(sequence) if request.bad_words else None
                token = pick_token(logits, request.sampling, rng, banned)
                if tokens and self._unsure(logits, token, request):
                    break
                tokens.append(token)
                sequence.append(token)
                if request.return_generation_logits:
                    rows.append(logits.copy())  # llama.cpp reuses its buffer on the next eval
                if request.end_id is not None and token == request.end_id:
                    break
                if i < n - 1:
                    ctx.eval([token])
            entry.tokens = sequence[: ctx.n_tokens]
        return EngineResult(tokens, 0, np.stack(rows) if rows else None)

    def _unsure(self, logits: np.ndarray, token: int, request: EngineRequest) -> bool:
        if self.draft_min_prob <= 0.0 or not request.sampling.greedy:
            return False
        shifted = np.exp(logits - logits[token])  # logits[token] is the max when greedy
        return 1.0 / float(shifted.sum()) < self.draft_min_prob

    def release(self, request_id: str) -> None:
        with self._lock:
            entry = self.cache.release(request_id)
            if entry is not None:
                self._idle.append(entry.state)

    def _context_for(self, request_id: str) -> CachedSequence:
        entry = self.cache.get(request_id)
        if entry is not None:
            return entry
        if len(self.cache) >= self.cache.capacity:
            ctx = self.cache.pop_oldest().state
        elif self._idle:
            ctx = self._idle.pop()
        else:
            ctx = self._new_context()
        entry = CachedSequence(ctx, [])
        self.cache.put(request_id, entry)
        return entry


def _last_logits(ctx) -> np.ndarray:
    """Logits of the last evaluated token. With logits_all=False llama-cpp-python no longer copies
    them into `scores`, so read llama.cpp's buffer directly (valid until the next eval)."""
    return np.ctypeslib.as_array(ctx._ctx.get_logits(), shape=(ctx.n_vocab(),))
