"""One call inside the torch engine's passes: a verification (one pass) or a generation (one pass per
token), what each pass's logits do to it, and the results it answers with (whole, or a streaming
generation's tokens as they come)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.sampling import Randomness
from minions.decoding.verification import verify_draft
from minions.engines.sequence_cache import CachedSequence
from minions.errors import InvalidRequest


@dataclass
class TorchJob:
    request: EngineRequest
    rng: Randomness
    sequence: list[int]
    entry: CachedSequence | None = None
    tokens: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    cached: int | None = None
    """Tokens of the input found in the sequence's cache at the job's first pass."""
    result: EngineResult | None = None
    error: InvalidRequest | None = None
    """What ended the job instead of a result (draft logits that do not fit)."""
    streamed: int = 0
    """Tokens of a streaming generation already answered (partial)."""
    kept: int | None = None
    """A verification's sequence length once its rejected draft tokens are cropped."""

    @property
    def draft(self) -> list[int]:
        """The draft to verify, cut to what the call may return."""
        return self.request.draft[: max(self.request.request_output_len - 1, 0)]

    def absorb(self, logits: np.ndarray) -> bool:
        """Apply a pass's logits; True when the job is finished (result set, or `kept` for a verification).
        InvalidRequest for draft logits that do not fit the draft or the vocabulary."""
        request = self.request
        if request.draft:
            try:
                verdict = verify_draft(logits, self.draft, params=request.sampling, rng=self.rng,
                                       context=request.input_ids, bad_words=request.bad_words, end_id=request.end_id,
                                       draft_logits=request.draft_logits, penalties=request.penalties)
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
            self.kept = len(request.input_ids) + verdict.num_accepted
            self.result = EngineResult(
                verdict.tokens, logits[: len(verdict.tokens)] if request.return_generation_logits else None,
                log_probs=request.log_probs(logits, verdict.tokens), cached_tokens=self.cached or 0,
            )
            return True
        token = request.next_token(logits[0], self.sequence, self.rng)
        self.tokens.append(token)
        self.sequence.append(token)
        self.rows.append(logits[0])
        done = request.generation_done(self.tokens)
        if done:
            rows = np.stack(self.rows) if request.return_generation_logits else None
            self.result = EngineResult(self.tokens, logits=rows, log_probs=request.log_probs(self.rows, self.tokens),
                                       cached_tokens=self.cached or 0)
        return done

    def partial(self) -> EngineResult | None:
        """The tokens a streaming generation made since the last call (None: nothing new)."""
        if not self.tokens[self.streamed:]:
            return None
        result = self._tokens_result(final=False)
        self.streamed = len(self.tokens)
        return result

    def final(self) -> EngineResult:
        """What is left to answer: every token, or a streaming job's tokens not yet reported."""
        if self.error is not None:
            raise self.error
        return self.result if not self.streamed else self._tokens_result(final=True)

    def _tokens_result(self, final: bool) -> EngineResult:
        request, tokens, rows = self.request, self.tokens[self.streamed:], self.rows[self.streamed:]
        return EngineResult(tokens, logits=np.stack(rows) if request.return_generation_logits and rows else None,
                            log_probs=request.log_probs(rows, tokens), final=final, cached_tokens=self.cached or 0)
