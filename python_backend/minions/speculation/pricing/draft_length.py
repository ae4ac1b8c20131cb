"""Adaptive speculation length: choose how many tokens to draft each round from measured costs.

Time per emitted token with s draft tokens, at load b (requests being decoded together):

    J(s) = (s * d(b) + t(b, s)) / E(s),   E(s) = 1 + sum_{i=1..s} prod_{j<=i} a_j

t(b, s) is the LLM's measured verification time when the requests verified together draft s tokens
each, d(b) the drafting time per token that rounds waited for (apart for pipelined requests, whose
early drafts hide most of it), and a_j the probability that draft position j is accepted once the
ones before it were (per request, pulled towards the server-wide estimate while the request has
little evidence of its own). E(s) is then the expected tokens per verification (accepted + the
LLM's own). s = 0 is plain decoding: J(0) = t(b, 0). t is the server's, learnt from every request's
rounds (fixed lengths and plain decoding verify on the same LLM); d and the server-wide a_j are kept
per set of SSMs requests draft with (the 0.5B's drafts are not the lookups'); only a_j is also kept
per request.

Why t is keyed on the batch's mean draft length, not the request's own: under load the LLM verifies
many requests in one pass, whose time grows with all of their tokens. Keyed on its own s, a request
that drafts longer than the rest sees the pass its shorter neighbours keep cheap, and every request
reasons the same way: all drift to long drafts that make every pass slow (measured in
docs/adaptive-draft-length.md). Keyed on the batch's length, t(b, s) is
what a pass costs when everyone drafts s, so a request is charged for the time its tokens add to the
others' pass too (for a pass linear in tokens, exactly its share). The decode loop reports each
request's work before its LLM call (`SharedLengthStats.report`).

Under load t(b, s) grows faster than linearly in s (the LLM's queue), so it is trusted only where it
was measured: a choice goes at most one candidate beyond the longest length measured at its load, and
only while the cost falls towards that length (`VerifyCostTable.trusted_lengths`). Requests climb
together one step at a time and measure each.

It does not oscillate: the estimates are moving averages, a change needs a `margin` gain over the
current s by the same estimates, and after a change the choice holds for `dwell` rounds (the paper's
"wait until requests drafted with the old s are through"). Lengths it has not measured are tried
every `explore_every` rounds (a neighbour of the current s, alternately above and below; from s = 0,
1 and the starting length), so that t(b, s) and the acceptance of further positions stay measured,
and so that a request whose acceptance collapsed to s = 0 still notices when it recovers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from minions.speculation.pricing.length_stats import AcceptanceModel, SharedLengthStats


class DraftLengthSelector:
    """One request's selector: per-request acceptance and draft cost over the shared statistics."""

    def __init__(self, shared: SharedLengthStats, max_length: int, pipelined: bool = False,
                 drafters: tuple[str, ...] = (), request_id: str | None = None) -> None:
        self.shared = shared
        self.pipelined = pipelined
        self.drafters = drafters
        """The SSMs the request drafts with: drafting's cost is theirs (`SharedLengthStats.draft_per_token`)."""
        self.request_id = request_id
        """Whose rounds these are: the pass each measured is the one its call went into (`pass_length`)."""
        policy = shared.policy
        self.policy = policy
        self.candidates = tuple(s for s in policy.candidates if s <= max_length) or (0,)
        self.acceptance = AcceptanceModel(policy.request_decay)
        self.start = min(self.candidates, key=lambda s: abs(s - policy.initial))
        """The length a request starts at, and the one plain decoding explores besides s = 1 (`_neighbour`)."""
        self.current = self.start
        self.held = 0
        self.rounds = 0
        self.explore_up = True

    # -- estimates ---------------------------------------------------------------------------------
    def rates(self, n: int) -> list[float]:
        """a_0 .. a_{n-1} for this request: its own counts blended with the server's rates."""
        server = self.shared.global_rates(n, self.drafters)
        return [self.acceptance.rate(j, g, self.policy.prior_weight) for j, g in enumerate(server)]

    def expected_tokens(self, s: int) -> float:
        return self._expected(s)[s]

    def _expected(self, n: int) -> list[float]:
        """E(0) .. E(n), the acceptance chain built once."""
        totals, total, survive = [1.0], 1.0, 1.0
        for a in self.rates(n):
            survive *= a
            total += survive
            totals.append(total)
        return totals

    def survival(self, n: int) -> float:
        """The estimated chance that the first n draft positions are all accepted."""
        return math.prod(self.rates(n))

    def time_per_token(self, s: int, batch: int) -> float | None:
        return self._costs(batch, [s])[s]

    def _costs(self, batch: int, lengths: Sequence[int]) -> dict[int, float | None]:
        """J at each length, with the cost table's line fitted and the acceptance chain built once."""
        verify = self.shared.verify.estimates(batch, lengths)
        expected = self._expected(max(lengths))
        # Drafting's cost is the server's at this load (all requests draft with the same SSMs), not
        # this request's own: its first draft is not representative (see `observe`), so its first
        # choices would take drafting as free and pick the longest draft; and one slow round could send
        # it to s = 0, where it drafts nothing more to correct the estimate.
        draft = self.shared.draft_estimate(batch, self.pipelined, self.drafters)
        return {s: None if verify[s] is None else (s * draft + verify[s]) / expected[s] for s in lengths}

    # -- the decision ------------------------------------------------------------------------------
    def choose(self, batch: int) -> int:
        """The draft length for the next round at the current load."""
        self.rounds += 1
        return self._decide(batch)

    def _decide(self, batch: int) -> int:
        if self.policy.explore_every and self.rounds % self.policy.explore_every == 0:
            return self._neighbour()
        if self.held > 0:
            self.held -= 1
            return self.current
        costs = self._costs(batch, range(self.candidates[-1] + 1))  # every length: the edges may lie between candidates
        trusted = self.shared.verify.trusted_lengths(batch, candidates=self.candidates, current=self.current,
                                                     costs=costs, margin=self.policy.margin)
        known = {s: costs[s] for s in self.candidates if costs[s] is not None and s in trusted}
        if not known or self.current not in known:
            return self.current
        best = min(known, key=lambda s: (known[s], s))
        if best != self.current and known[best] < (1.0 - self.policy.margin) * known[self.current]:
            # Until plain decoding has been measured at all (a fresh server), the cost below the
            # measured lengths is their level carried down: any shorter draft looks cheaper than plain
            # decoding, and each costs an LLM call for a token or two. A move down is then to 0.
            if 0 < best < self.current and 0 in self.candidates and not self.shared.verify.measured_anywhere(0):
                best = 0
            self.current = best
            self.held = self.policy.dwell
        return self.current

    def _neighbour(self) -> int:
        """The length to explore: a neighbour of the current one, alternately above and below. From plain
        decoding, "below" is the starting length: where every verification and every draft call cost
        more than their tokens (torch on a CPU), a 1-token draft does not pay when longer ones would,
        and the line through t(0) and t(1) priced every longer draft out: a request at 0 stayed there
        (docs/adaptive-draft-length.md, "Exploring from plain decoding")."""
        i = self.candidates.index(self.current)
        step = 1 if self.explore_up else -1
        self.explore_up = not self.explore_up
        if i + step < 0 and self.start > self.current:
            return self.start
        j = i + step if 0 <= i + step < len(self.candidates) else i - step
        return self.candidates[min(max(j, 0), len(self.candidates) - 1)]

    # -- feedback ----------------------------------------------------------------------------------
    def observe(self, batch: int, drafted: int, accepted: int, draft_seconds: float | None,
                verify_seconds: float, drafters: tuple[str, ...] | None = None) -> None:
        """One round's outcome, into this request's estimates and the server's (`SharedLengthStats.observe`),
        the latter under `drafters` where the round's draft came from some of the request's SSMs alone
        (a lookup asked ahead of the vote's models: Proposal.ahead). Such a round's acceptance is not
        the request's: the length chosen here is the whole drafter set's, and a lookup's whole copy
        accepted would price the models' drafts as if they copied too."""
        self.shared.observe(batch, self.pipelined, drafted, accepted, draft_seconds=draft_seconds,
                            verify_seconds=verify_seconds, drafters=drafters or self.drafters,
                            request_id=self.request_id)
        if drafted > 0 and drafters is None:
            self.acceptance.observe(drafted, accepted)


class FixedLength:
    """A fixed draft length (0: plain decoding), with the selector's interface: its rounds still
    measure the LLM and the SSMs for the server's statistics, whoever chose the length."""

    def __init__(self, length: int, shared: SharedLengthStats, pipelined: bool = False,
                 drafters: tuple[str, ...] = (), request_id: str | None = None) -> None:
        self.current = length
        self.shared = shared
        self.pipelined = pipelined
        self.drafters = drafters
        self.request_id = request_id

    def choose(self, batch: int) -> int:
        return self.current

    def survival(self, n: int) -> float | None:
        """No estimate of acceptance is kept for a fixed length."""
        return None

    def observe(self, batch: int, drafted: int, accepted: int, draft_seconds: float | None,
                verify_seconds: float, drafters: tuple[str, ...] | None = None) -> None:
        self.shared.observe(batch, self.pipelined, drafted, accepted, draft_seconds=draft_seconds,
                            verify_seconds=verify_seconds, drafters=drafters or self.drafters,
                            request_id=self.request_id)


def length_policy(shared: SharedLengthStats, *, drafting: bool, num_draft_tokens: int | None, max_draft_tokens: int,
                  pipelined: bool, drafters: tuple[str, ...],
                  request_id: str | None) -> DraftLengthSelector | FixedLength:
    """A request's length policy: the adaptive selector when it drafts with no fixed length
    (`num_draft_tokens` None), else its fixed length (0 for plain decoding); both feed the server's
    length statistics."""
    if drafting and num_draft_tokens is None:
        return DraftLengthSelector(shared, max_draft_tokens, pipelined=pipelined, drafters=drafters,
                                   request_id=request_id)
    return FixedLength(num_draft_tokens or 0, shared, pipelined=pipelined, drafters=drafters, request_id=request_id)
