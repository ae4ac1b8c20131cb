"""Suffix drafting (after SuffixDecoding): continue the sequence the way its longest matching suffix
continued before, in the request's own context or in the sequences of recently finished requests.

Like prompt lookup (ngram_engine.py) it needs no model, but it also learns from other requests (agents,
repeated prompts and answers) and weighs continuations by how often they occurred. Instead of a suffix
tree it keeps, per token stream, where each m-gram (m = `min_match`) ended; a call widens the match
backwards over those positions and extends it forwards, token by token, with the most frequent
continuation. Each request's stream is updated by what it appended since the last call, so a
call costs the new tokens and the candidates, never a rescan of the sequence or of the corpus.
"""

from __future__ import annotations

import threading
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.decoding.tokens import common_prefix_len
from minions.engines.api import BatchStats
from minions.engines.draft_confidence import DraftConfidence, Evidence, confident_prefix
from minions.engines.lookup_engine import LookupEngine
from minions.engines.ngram_engine import spec_limit
from minions.engines.sequence_cache import CachedSequence, SequenceCache

SEP = -1
"""Ends every sequence in the corpus: no match or continuation crosses it."""
MAX_CANDIDATES = 256
"""Occurrences of the last m-gram a call looks at, most recent first: bounds the cost of common m-grams."""
_NONE = np.empty(0, dtype=np.int64)
_MIX = np.uint64(0x9E3779B97F4A7C15)


def gram_keys(tokens: np.ndarray, m: int) -> list[int]:
    """A 64-bit key for each m-gram of `tokens`, in order. Plain ints: no tuple per position for the
    garbage collector to walk. Keys may collide, so a match is always checked against the tokens."""
    window = tokens.astype(np.uint64)
    n = len(window) - m + 1
    if n <= 0:
        return []
    keys = window[:n].copy()
    for i in range(1, m):
        keys = keys * _MIX + window[i: i + n]
    return keys.tolist()


class TokenIndex:
    """A token stream (absolute positions start..end) indexed by m-gram: `last` maps an m-gram's key to
    where it last ended, and `prev[p]` chains each such end to the previous one. Tokens are appended or
    truncated at the end and evicted at the head, each at the cost of the tokens concerned. Flat arrays
    and int-to-int entries: nothing per position for the garbage collector to walk."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.buf = np.empty(256, dtype=np.int64)
        self.prev = array("q")  # per position, like buf; -1: no earlier end
        self.offset = self.start = self.end = 0  # buf[0] and prev[0] are position `offset`
        self.last: dict[int, int] = {}

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def first_end(self) -> int:
        """The first position an indexed m-gram (all its tokens live) can end at."""
        return self.start + self.m - 1

    def _grams(self, first: int, stop: int) -> Iterator[tuple[int, int]]:
        """(end position, m-gram key) for the m-grams ending in first..stop-1."""
        window = self.buf[min(first, stop) - self.m + 1 - self.offset: stop - self.offset]
        return zip(range(first, stop), gram_keys(window, self.m))

    def extend(self, tokens: Sequence[int]) -> None:
        n = len(tokens)
        if self.end - self.offset + n > len(self.buf):  # grow, dropping the evicted head
            live = self.buf[self.start - self.offset: self.end - self.offset]
            self.buf = np.empty(max(256, 2 * (len(live) + n)), dtype=np.int64)
            self.buf[: len(live)] = live
            self.prev, self.offset = self.prev[self.start - self.offset:], self.start
        self.buf[self.end - self.offset: self.end - self.offset + n] = tokens
        first, old_end = max(self.end, self.first_end), self.end
        self.end += n
        self.prev.extend([-1] * min(n, first - old_end))
        for p, key in self._grams(first, self.end):
            self.prev.append(self.last.get(key, -1))
            self.last[key] = p

    def truncate(self, length: int) -> None:
        """Keep positions before `length` (a rewind: rejected draft tokens, an edited sequence)."""
        length = max(length, self.start)
        for p, key in reversed(list(self._grams(max(length, self.first_end), self.end))):
            before = self.prev[p - self.offset]  # p is the latest end of its m-gram: the one before takes over
            if before >= self.first_end:
                self.last[key] = before
            else:
                del self.last[key]
        del self.prev[length - self.offset:]
        self.end = length

    def evict(self, position: int) -> None:
        """Drop the positions before `position`, and every m-gram that touches them."""
        position = min(position, self.end)
        for p, key in self._grams(self.first_end, min(position + self.m - 1, self.end)):
            if self.last.get(key) == p:  # its latest end is going: so are all the earlier ones
                del self.last[key]
        self.start = position

    def _ends(self, key: int) -> np.ndarray:
        """Where the m-gram `key` ended, with something after it: most recent first, MAX_CANDIDATES at most."""
        found, p = [], self.last.get(key, -1)
        while p >= self.first_end and len(found) < MAX_CANDIDATES:
            if p < self.end - 1:  # the sequence's own last tokens have nothing after them
                found.append(p)
            p = self.prev[p - self.offset]
        return np.array(found, dtype=np.int64)

    def occurrences(self, pattern: np.ndarray) -> tuple[int, np.ndarray]:
        """The longest suffix of `pattern` (at least m tokens) found earlier with a continuation: its
        length and the positions where it ends, most recent first; (0, empty) when there is none."""
        ends, length = self._ends(gram_keys(pattern[-self.m:], self.m)[0]), 0
        for j in range(len(pattern) if ends.size else 0):
            back = ends - j
            same = (back >= self.start) & (self.buf[np.maximum(back, self.start) - self.offset] == pattern[-1 - j])
            if not same.any():
                break
            ends, length = ends[same], j + 1
        return (length, ends) if length >= self.m else (0, _NONE)

    def continuation(self, ends: np.ndarray, k: int, min_prob: float) -> tuple[list[int], list[float]]:
        """Up to k tokens, each the most frequent next token of the occurrences still agreeing (the most
        recent one's on ties), while the product of their shares stays >= min_prob. Also returns that
        product at each token (the sum is SuffixDecoding's score, the draft's expected accepted length
        by the matches alone)."""
        draft: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(draft) < k and ends.size:
            ends = ends[ends + len(draft) + 1 < self.end]
            tokens = self.buf[ends + len(draft) + 1 - self.offset]
            ends, tokens = ends[tokens != SEP], tokens[tokens != SEP]
            if ends.size == 1:  # one occurrence left: copy the rest of its continuation
                first = int(ends[0]) + len(draft) + 1
                rest = self.buf[first - self.offset: min(self.end, first + k - len(draft)) - self.offset]
                stop = np.flatnonzero(rest == SEP)
                rest = rest[: stop[0]] if stop.size else rest
                draft += rest.tolist()
                probs += [prob] * len(rest)
                break
            if not ends.size:
                break
            _, inverse, counts = np.unique(tokens, return_inverse=True, return_counts=True)
            best = int(np.argmax(counts[inverse]))  # the first (most recent) of the most frequent
            prob *= counts[inverse[best]] / tokens.size
            if prob < min_prob:
                break
            draft.append(int(tokens[best]))
            probs.append(prob)
            ends = ends[inverse == inverse[best]]
        return draft, probs


class Continuation(NamedTuple):
    """A draft, what it rests on, and the product of its tokens' shares among the matches at each token."""

    evidence: Evidence
    draft: list[int]
    shares: list[float]


class SuffixEngine(LookupEngine):
    """An `Engine` (engines/api.py) and `MeteredEngine`: drafts from the request's own stream (kept per
    request id, LRU beyond `max_sequences`) and from a shared corpus of released sequences holding at
    most `corpus_tokens` tokens, oldest sequences evicted first. Greedy and without logits, like NgramEngine.

    A draft ends where its estimated chance of being right so far falls below `min_confidence`: the
    matches' shares times what drafts after such a match (its source, its length) turned out to be
    worth (draft_confidence.py)."""

    def __init__(self, *, max_match: int, min_match: int, min_prob: float, corpus_tokens: int,
                 max_sequences: int, spec_factor: float, min_confidence: float = 0.0,
                 settle_margin: int = 16) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.max_match, self.min_match, self.min_prob = max_match, min_match, min_prob
        self.spec_factor = spec_factor
        self.min_confidence = min_confidence
        self.confidence = DraftConfidence(settle_margin, max_requests=4 * max_sequences)
        self.corpus_tokens = corpus_tokens
        self.corpus = TokenIndex(min_match)
        self.corpus_ends: deque[int] = deque()  # where each corpus sequence ends, oldest first
        self.cache: SequenceCache[TokenIndex] = SequenceCache(max_sequences)
        self.stats = BatchStats()
        self._lock = threading.Lock()

    def _lookup(self, request: EngineRequest) -> tuple[list[int], list[float]]:
        with self._lock:
            own = self._update(request.request_id, request.input_ids)
            self.stats.passes += 1
            self.stats.sequences += 1
            chosen = self._draft(own, request.input_ids, request.request_output_len)
        tokens: list[int] = []
        chances: list[float] = []
        if chosen is not None:
            found, chances = chosen
            self.confidence.record(request.request_id, request.input_ids, found.draft, found.evidence)
            tokens = found.draft[: len(chances)]
        with self._lock:
            self.stats.tokens += len(tokens)
        return tokens, chances

    def release(self, request_id: str) -> None:
        """The request is over: its last sequence joins the corpus (unknown ids are ignored)."""
        super().release(request_id)
        with self._lock:
            entry = self.cache.release(request_id)
            if entry is None or self.corpus_tokens < 2 or len(entry.tokens) < 2:
                return
            self.corpus.extend([*entry.tokens[-(self.corpus_tokens - 1):], SEP])
            self.corpus_ends.append(self.corpus.end)
            while len(self.corpus) > self.corpus_tokens:
                self.corpus.evict(self.corpus_ends.popleft())

    def cached_bytes(self) -> int | None:
        """No KV cache: nothing the metric means."""
        return None

    def _update(self, request_id: str, tokens: list[int]) -> TokenIndex:
        """The request's stream, brought to `tokens`: appended to, or truncated to the common prefix first."""
        entry = self.cache.get(request_id)
        if entry is None:
            entry = CachedSequence(TokenIndex(self.min_match))
            self.cache.put(request_id, entry)  # an evicted entry is dropped: its request may still be live
        n = len(entry.tokens)
        if tokens[:n] != entry.tokens:
            n = common_prefix_len(entry.tokens, tokens)
            entry.state.truncate(n)
        entry.state.extend(tokens[n:])
        entry.tokens = list(tokens)
        return entry.state

    def _confident(self, found: Continuation) -> list[float]:
        """The estimated chance that the draft's first 1, 2, ... tokens are all right, over the tokens
        kept (the confident prefix): what drafts after such a match were worth times the matches' shares.
        Their sum is the expected number of tokens right."""
        survival = self.confidence.survival(found.evidence, len(found.draft))
        chances = [c * p for c, p in zip(survival, found.shares)]
        return chances[: confident_prefix(chances, self.min_confidence)]

    def _draft(self, own: TokenIndex, tokens: list[int], k: int) -> tuple[Continuation, list[float]] | None:
        """The best continuation of the request's own stream and of the corpus, with what it rests on
        and its shares, and the chances of its kept tokens (`_confident`): the one expected to have
        more tokens right (draft_confidence.py), the longer match on ties, the request's own context
        before the corpus. A match of m tokens drafts at most
        spec_factor * m (SuffixDecoding's max_spec_factor): a short match, one that any text has, is
        weak evidence for a long continuation."""
        if k <= 0 or len(tokens) < self.min_match:
            return None
        pattern = np.asarray(tokens[-self.max_match:], dtype=np.int64)
        best, best_value = None, (0.0, 0)
        for name, source in (("own", own), ("corpus", self.corpus)):
            length, ends = source.occurrences(pattern)
            if not length:
                continue
            draft, shares = source.continuation(ends, spec_limit(k, length, self.spec_factor), self.min_prob)
            if not draft:
                continue
            found = Continuation(Evidence(name, length), draft, shares)
            chances = self._confident(found)
            if best is None or (sum(chances), length) > best_value:
                best, best_value = (found, chances), (sum(chances), length)
        return best
