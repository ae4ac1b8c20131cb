"""What the lookup drafters (prompt lookup, suffix matching) answer alike: a call is a draft continuing
its input_ids; a `stop` releases the request; a draft to verify is refused (they only draft); each
draft goes back with its tokens' learnt chances of being right (draft_confidence.py), by which the
orchestrator cuts drafts.

A lookup has no logits, so none are returned for return_generation_logits, and a sampled request's
draft counts as deterministic, which it is.
"""

from __future__ import annotations

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.draft_confidence import DraftConfidence, token_log_probs
from minions.errors import InvalidRequest


class LookupEngine:
    """An `Engine` (engines/api.py) whose drafts a subclass looks up (`_lookup`); the outcome of each
    draft is scored the next time its request asks (`confidence`)."""

    confidence: DraftConfidence

    def generate(self, request: EngineRequest) -> EngineResult:
        if request.stop:
            self.release(request.request_id)
            return EngineResult([])
        if request.draft:
            raise InvalidRequest("this engine drafts only: draft_input_ids are not supported")
        self.confidence.settle(request.request_id, request.input_ids)
        tokens, survival = self._lookup(request)
        if request.end_id is not None and request.end_id in tokens:  # the draft ends with the request
            tokens = tokens[: tokens.index(request.end_id) + 1]
        log_probs = token_log_probs(survival[: len(tokens)]) if request.return_log_probs else None
        return EngineResult(tokens, log_probs=log_probs)

    def release(self, request_id: str) -> None:
        """The request is over: its drafts still waiting for their outcome are dropped."""
        self.confidence.forget(request_id)

    def _lookup(self, request: EngineRequest) -> tuple[list[int], list[float]]:
        """The draft continuing request.input_ids (at most request_output_len tokens, each recorded
        with `confidence`), and the estimated chance that its first 1, 2, ... tokens are right (what
        `generate` answers as each kept token's log chance; may be empty when none is asked for)."""
        raise NotImplementedError
