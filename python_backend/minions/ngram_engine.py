"""Prompt-lookup drafting as an engine, so the orchestrator calls it like any other SSM."""

from __future__ import annotations

from .engine_api import EngineRequest, EngineResult
from .errors import InvalidRequest
from .ngram import ngram_draft


class NgramEngine:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def generate(self, request: EngineRequest) -> EngineResult:
        if request.stop:
            return EngineResult([])
        if request.draft:
            raise InvalidRequest("this engine drafts only: draft_input_ids are not supported")
        # return_generation_logits: a lookup has no logits, so none are returned (the draft is then
        # treated as deterministic, which is exactly what it is).
        tokens = ngram_draft(request.input_ids, request.request_output_len, self.max_ngram, self.min_ngram)
        if request.end_id is not None and request.end_id in tokens:
            tokens = tokens[: tokens.index(request.end_id) + 1]
        return EngineResult(tokens)

    def release(self, request_id: str) -> None:
        """Stateless: nothing to free."""
