"""Learnt confidence for lookup drafts: how often a draft made after a match of a given length turned
out right, position by position.

A lookup drafter (prompt lookup, suffix matching) knows how long a match its draft continues, but not
how often such a match goes on as the text will: a 2-token match found in another request's answer
is mostly wrong in chat, a 24-token match in the request's own prompt is mostly right in a code edit.
So each draft is scored against the text the request goes on to produce, the next time the request
asks, and the counts are kept per kind of match (`Evidence`: where it was found, how long it is).
Every draft is scored, whether or not the orchestrator verified it, and its whole length, however
much of it was sent: greedy, the LLM's tokens are the same either way, so the estimate does not
depend on the choices it informs (a cut made from acceptance measured only on verified drafts
reinforced itself: docs/benchmarks.md, "Probe drafts cut to what pays"). Each position counts as soon
as the text shows it, a draft's later positions staying open (censored, as in a Kaplan-Meier estimate):
waiting for a draft's whole outcome would count failures, known early, more often than long runs of
right tokens, known late or never.

The last `settle_margin` tokens of a request's sequence may be another drafter's draft still being
verified (an early draft continues the sequence with the draft under verification), so only the
positions before them count as the request's text.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from minions.decoding.tokens import draft_outcome
from minions.engines.sequence_cache import CachedSequence, SequenceCache

POSITIONS = 32
"""Draft positions with counts of their own; later ones share the last."""
PENDING = 4
"""Drafts per request awaiting their outcome; older ones are dropped."""
MATCH_BUCKETS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
"""Match lengths are counted in these buckets (each from its value up to the next)."""


@dataclass(frozen=True)
class Evidence:
    """What a draft rests on: the source it was found in and the length of the match it continues."""

    source: str
    match: int

    @property
    def bucket(self) -> tuple[str, int]:
        return self.source, max((b for b in MATCH_BUCKETS if b <= self.match), default=0)

    @property
    def prior(self) -> float:
        """The chance that each next token is right before any outcome is known: a longer match is
        stronger evidence (2 tokens: 0.5, 8: 0.8, 24: 0.92)."""
        return self.match / (self.match + 2.0)


@dataclass
class _Draft:
    start: int
    tokens: list[int]
    bucket: tuple[str, int]
    premise: list[int]
    """The last tokens before `start` the draft continued: those that may have been a draft themselves."""
    counted: int = 0
    """Its leading positions already counted right."""


class DraftConfidence:
    """Per-position acceptance counts by kind of match, from the outcomes of one drafter's drafts.

    `record` a draft when it is made, `settle` each request's sequence when the request asks again
    (drafts whose outcome is now known are counted), `forget` a request when it ends; `survival` is
    the estimated chance that a draft's first 1, 2, ... tokens are all right. Thread-safe."""

    def __init__(self, settle_margin: int, prior_weight: float = 2.0, max_requests: int = 256) -> None:
        self.settle_margin = settle_margin
        self.prior_weight = prior_weight
        self.hits: dict[tuple[str, int], np.ndarray] = {}
        self.trials: dict[tuple[str, int], np.ndarray] = {}
        self._pending: SequenceCache[list[_Draft]] = SequenceCache(max_requests)
        self._lock = threading.Lock()

    def survival(self, evidence: Evidence, n: int) -> list[float]:
        """P(the first i tokens are right) for i = 1..n."""
        bucket = evidence.bucket
        hits = self.hits.get(bucket, np.zeros(POSITIONS))
        trials = self.trials.get(bucket, np.zeros(POSITIONS))
        w = self.prior_weight
        rate = (hits + w * evidence.prior) / (trials + w)
        rates = rate[np.minimum(np.arange(n), POSITIONS - 1)]
        return np.cumprod(rates).tolist()

    def record(self, request_id: str, sequence: Sequence[int], draft: Sequence[int], evidence: Evidence) -> None:
        """A draft continuing the request's `sequence` was made."""
        if not draft:
            return
        start = len(sequence)
        premise = list(sequence[max(0, start - self.settle_margin): start])
        with self._lock:
            entry = self._pending.get(request_id)
            if entry is None:
                entry = CachedSequence([])
                self._pending.put(request_id, entry)
            entry.state.append(_Draft(start, list(draft), evidence.bucket, premise))
            del entry.state[:-PENDING]

    def settle(self, request_id: str, sequence: Sequence[int]) -> None:
        """Count what `sequence` (all but its last `settle_margin` tokens) shows of the request's
        drafts: each position once, as soon as the text covers it; a draft is done at its first wrong
        token or its end. A draft made after tokens the sequence no longer has (a rejected draft it
        was made on) is dropped."""
        with self._lock:
            entry = self._pending.get(request_id)
            if entry is None or not entry.state:
                return
            known = len(sequence) - self.settle_margin
            waiting = []
            for draft in entry.state:
                first = draft.start - len(draft.premise)
                if list(sequence[first: draft.start]) != draft.premise[: max(0, len(sequence) - first)]:
                    continue
                seen = list(sequence[draft.start: max(draft.start, known)])
                right = draft_outcome(seen, draft.tokens)
                if right is None:
                    self._count(draft.bucket, draft.counted, len(seen), wrong=False)
                    draft.counted = max(draft.counted, len(seen))
                    waiting.append(draft)
                else:
                    self._count(draft.bucket, draft.counted, right, wrong=right < len(draft.tokens))
            entry.state = waiting

    def forget(self, request_id: str) -> None:
        """The request is over: its drafts still waiting are dropped (their outcome never shows)."""
        with self._lock:
            self._pending.release(request_id)

    def _count(self, bucket: tuple[str, int], start: int, right: int, wrong: bool) -> None:
        """Positions start..right-1 were tried and right; position `right`, when `wrong`, tried and wrong."""
        if right + wrong <= start:
            return
        hits = self.hits.setdefault(bucket, np.zeros(POSITIONS))
        trials = self.trials.setdefault(bucket, np.zeros(POSITIONS))
        tried = np.minimum(np.arange(start, right + wrong), POSITIONS - 1)
        np.add.at(trials, tried, 1.0)
        np.add.at(hits, tried[: right - start], 1.0)


def token_log_probs(survival: Sequence[float]) -> list[float]:
    """Each draft token's estimated log probability of being right given the ones before it were: the
    log of survival's successive ratios, so that their running sums are the log of `survival` (the
    meaning tensorrt_llm's `output_log_probs` has for a model's sampled tokens)."""
    logs = np.log(np.maximum(np.asarray(survival, dtype=np.float64), 1e-12))
    return np.diff(logs, prepend=0.0).tolist()


def confident_prefix(survival: Sequence[float], min_confidence: float) -> int:
    """How many leading tokens keep their estimated chance of being right at `min_confidence` or more."""
    return next((i for i, p in enumerate(survival) if p < min_confidence), len(survival))
