"""A transformers causal LM as an engine: plain generation and draft verification with a prefix KV cache.

This is the CPU stand-in for a TensorRT-LLM engine. Each sequence (request id) keeps a DynamicCache;
every call computes only the tokens past the longest common prefix of what is cached and what is sent,
and KV of rejected draft tokens is cropped away at once, so only the accepted prefix survives.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from .engine_api import EngineRequest, EngineResult
from .errors import InvalidRequest
from .sampling import pick_token
from .sequence_cache import CachedSequence, SequenceCache, common_prefix_len
from .verification import verify_draft

log = logging.getLogger(__name__)


def load_causal_lm(path: str, dtype: str = "float32", gguf_file: str | None = None):
    """Load a transformers model from a local directory (or a GGUF file in it); never downloads."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, gguf_file=gguf_file, dtype=getattr(torch, dtype), local_files_only=True
    )
    return model.eval()


class TorchEngine:
    """Engine protocol implementation over a transformers model (see engine_api)."""

    def __init__(
        self, model, max_sequences: int = 8, max_context: int | None = None, min_forward_tokens: int = 1
    ) -> None:
        self.model = model.eval()
        # Passes of 2..min_forward_tokens-1 new tokens are padded up to min_forward_tokens: on this
        # CPU's MKL a 2-3 row matmul is slower than a 4-row one. Pads follow the real tokens, so
        # causal attention keeps them out of the real rows; their KV is cropped right after.
        self.min_forward_tokens = min_forward_tokens
        self.vocab_size = int(model.config.vocab_size)
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 2048))
        self.cache: SequenceCache = SequenceCache(max_sequences)
        self._lock = threading.Lock()
        self.forward_tokens = 0

    # -- Engine protocol -------------------------------------------------------------------------
    def generate(self, request: EngineRequest) -> EngineResult:
        if request.stop:
            self.release(request.request_id)
            return EngineResult([])
        total = len(request.input_ids) + max(request.request_output_len, len(request.draft) + 1)
        if total > self.max_context:
            raise InvalidRequest(f"sequence of {total} tokens exceeds the engine's context of {self.max_context}")
        rng = np.random.default_rng(request.seed)
        with self._lock, torch.inference_mode():
            if request.draft:
                return self._verify(request, rng)
            return self._generate(request, rng)

    def release(self, request_id: str) -> None:
        with self._lock:
            self.cache.release(request_id)

    # -- internals ---------------------------------------------------------------------------------
    def _verify(self, request: EngineRequest, rng: np.random.Generator) -> EngineResult:
        draft = request.draft[: max(request.request_output_len - 1, 0)]
        entry, logits = self._forward(request.request_id, request.input_ids, draft, len(draft) + 1)
        try:
            verdict = verify_draft(
                logits, draft, request.sampling, rng, request.input_ids, request.bad_words, request.end_id,
                request.draft_logits,
            )
        except ValueError as exc:  # draft_logits that do not fit the draft or the vocabulary
            raise InvalidRequest(str(exc)) from None
        self._crop(entry, len(request.input_ids) + verdict.num_accepted)
        return EngineResult(
            verdict.tokens,
            verdict.num_accepted,
            logits[: len(verdict.tokens)] if request.return_generation_logits else None,
        )

    def _generate(self, request: EngineRequest, rng: np.random.Generator) -> EngineResult:
        sequence = list(request.input_ids)
        tokens: list[int] = []
        rows = []
        for _ in range(request.request_output_len):
            _, logits = self._forward(request.request_id, sequence, [], 1)
            banned = request.bad_words.banned_next(sequence) if request.bad_words else None
            token = pick_token(logits[0], request.sampling, rng, banned)
            tokens.append(token)
            sequence.append(token)
            rows.append(logits[0])
            if request.end_id is not None and token == request.end_id:
                break
        return EngineResult(tokens, 0, np.stack(rows) if request.return_generation_logits else None)

    def _forward(self, request_id: str, tokens: list[int], extra: list[int], n_logits: int):
        """Run the model over `tokens + extra`, reusing the cached prefix; logits of the last n positions."""
        from transformers import DynamicCache

        entry = self.cache.get(request_id)
        if entry is None:
            entry = CachedSequence(DynamicCache(config=self.model.config), [])
            self.cache.put(request_id, entry)
        keep = min(common_prefix_len(entry.tokens, tokens), len(tokens) - 1)
        if keep == 0:
            entry.state = DynamicCache(config=self.model.config)
            entry.tokens = []
        else:
            self._crop(entry, keep)
        new = tokens[keep:] + list(extra)
        pad = self.min_forward_tokens - len(new) if 1 < len(new) < self.min_forward_tokens else 0
        out = self.model(
            input_ids=torch.tensor([new + [new[-1]] * pad], dtype=torch.long),
            past_key_values=entry.state,
            use_cache=True,
            logits_to_keep=n_logits + pad,
        )
        entry.tokens = list(tokens) + list(extra)
        if pad:
            entry.state.crop(-pad)
        self.forward_tokens += len(new)
        return entry, out.logits[0, :n_logits].float().numpy()

    @staticmethod
    def _crop(entry: CachedSequence, length: int) -> None:
        current = entry.state.get_seq_length()
        if length < current:
            entry.state.crop(-(current - length))  # transformers 5: positive lengths raise
        entry.tokens = entry.tokens[:length]
