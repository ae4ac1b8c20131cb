"""What the adaptive draft-length selector learns from every request's rounds (see draft_length.py
for the cost model): t(b, s), the LLM's verification cost per load and batch draft length
(`VerifyCostTable`); drafting's cost per token; the acceptance a_j per draft position
(`AcceptanceModel`). `SharedLengthStats` holds the server-wide ones; `LengthPolicy` the settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from minions.settings import DEFAULTS


def load_bucket(batch: int) -> int:
    """Loads 1, 2, 3-4, 5-8, 9-16...: verification cost changes with the batch roughly by powers of two."""
    return 1 << max(0, math.ceil(math.log2(max(batch, 1))))


def buckets_by_nearness(buckets: set[int], batch: int) -> list[int]:
    """Measured load buckets, the one nearest to `batch` first (nearest on a log scale)."""
    target = math.log2(load_bucket(batch))
    return sorted(buckets, key=lambda b: (abs(math.log2(b) - target), b))


def server_weight(weight: float, batch: int) -> float:
    """The weight of one request's observation in a server-wide average, when `batch` requests each
    send one per round: `weight` per round of the whole batch, so the average remembers as many rounds
    at every load. At `weight` per observation, a busy server's averages would hold only the last few
    requests' rounds, all from one moment, and swing with it."""
    return weight / max(batch, 1)


@dataclass
class Ema:
    """Exponential moving average; the first observation is taken as it is."""

    weight: float
    value: float | None = None
    count: int = 0

    def add(self, x: float, weight: float | None = None) -> None:
        """`weight`: this observation's, instead of the average's own."""
        w = self.weight if weight is None else weight
        self.value = x if self.value is None else self.value + w * (x - self.value)
        self.count += 1


@dataclass
class RoundMemory:
    """When each cost was last measured, in rounds of a clock, and whether that is within `rounds` of
    now: a cost that only its own kind of round measures, and that can keep those rounds from
    happening (priced too dear), is forgotten then instead of deciding for good (DraftCosts,
    VerifyCostTable)."""

    rounds: int
    measured_at: dict = field(default_factory=dict)

    def measured(self, key: object, now: int) -> None:
        self.measured_at[key] = now

    def remembers(self, key: object, now: int) -> bool:
        return now - self.measured_at.get(key, now) <= self.rounds


@dataclass
class VerifyCostTable:
    """t(b, s): measured LLM verification seconds per load bucket and the batch's mean draft length."""

    weight: float = 0.2
    """Per round of the whole batch (`server_weight`); the drafting cost's averages use it too."""
    shrink: float = 4.0
    plain_streams: bool = False
    """t(b, 0) is a step of a stream, not a call (a streaming LLM: loop.py's `StreamPlain`): it is
    no point of the line the verifications lie on (`_fitted`)."""
    memory_rounds: int = 0
    """A verified length (s >= 1) that no round has measured for this many rounds (observations of any
    length at any load) is forgotten, its next measure taken as it is (0: never). Only a verification
    measures one, and a table whose costs price every draft out sees none (one 80 ms verification of
    8 tokens against 6 ms plain steps cuts drafts of 90% chances a token to nothing): the likeliest
    reason a fresh server stayed plain for its last 347 requests (docs/experiments.md, "Open: a fresh
    server that stopped drafting for good")."""
    cells: dict[tuple[int, int], Ema] = field(default_factory=dict)
    rounds: int = 0
    """Observations so far: the clock of `memory_rounds`."""
    memory: RoundMemory = field(init=False)

    def __post_init__(self) -> None:
        self.memory = RoundMemory(self.memory_rounds)

    def observe(self, batch: int, s: int, seconds: float) -> None:
        self.rounds += 1
        key = (load_bucket(batch), s)
        if key in self.cells and not self._remembered(key):
            del self.cells[key]
        self.cells.setdefault(key, Ema(self.weight)).add(seconds, server_weight(self.weight, batch))
        self.memory.measured(key, self.rounds)

    def _remembered(self, key: tuple[int, int]) -> bool:
        """Whether the cell still counts: plain steps (s = 0) always, a verified length within memory."""
        return key[1] == 0 or not self.memory_rounds or self.memory.remembers(key, self.rounds)

    def estimate(self, batch: int, s: int) -> float | None:
        """Interpolation over the nearest bucket's measured lengths, and beyond them their trend.

        Each length's value is shrunk towards the bucket's least-squares line by its number of
        observations (`shrink` observations' worth of line): under load one verification's time
        swings with whatever else the LLM is doing, and a length seen once would otherwise steer
        every request. Beyond the measured lengths the line's slope continues from the last one:
        extending flat would make every longer draft look free. A bucket measured at one length
        only takes the shape of the nearest load's curve, at its own level."""
        return self.estimates(batch, [s])[s]

    def estimates(self, batch: int, lengths: Sequence[int]) -> dict[int, float | None]:
        """`estimate` at each length, the bucket's line fitted once (a decision prices every length)."""
        for bucket in self._buckets_by_nearness(batch):
            measured = self._points(bucket)
            if measured:
                fitted = self._fitted(measured)
                line = _line(fitted)
                relative = self._relative_trend(batch) if line is None else 0.0
                # Lengths left out of the fit (a streamed t(b, 0)) stay as measured, not shrunk towards its line.
                points = sorted(self._smoothed(fitted, line) + [(n, t) for n, t, _ in measured if n < fitted[0][0]])
                return {s: _on_curve(points, line, relative, s) for s in lengths}
        return dict.fromkeys(lengths)

    def within_reach(self, batch: int, lengths: Sequence[int]) -> dict[int, float | None]:
        """`estimates` for pricing one draft by its own chances (draft_length.worth_verifying), with
        the measured lengths' reach doubled: beyond the longest measured at this load, lengths up to
        twice it cost what it costs, and longer ones rise from there at the line's slope. Beyond the
        measured lengths the line is a guess, and a draft it prices out is never verified to measure
        it: a fresh server whose first verifications were of 3 and 4 tokens (one each, the 4 cold)
        extrapolated t(16) at 102 ms where 55-60 is measured, cut every copy to 3 tokens and drafted
        none in 83 probes. Priced so, a draft whose chances are good goes further, is measured, and
        the reach doubles (4, 8, 16), as the length policy steps one candidate beyond its measured
        lengths (DraftLengthSelector._trusted)."""
        edge = max(self.measured_lengths(batch), default=0)
        costs = self.estimates(batch, sorted({*lengths, edge, 2 * edge}))
        at_edge = costs[edge]
        if edge == 0 or at_edge is None:
            return {s: costs[s] for s in lengths}
        lift = costs[2 * edge] - at_edge  # what the line adds over the doubled reach
        return {s: max(at_edge, costs[s] - lift) if s > edge else costs[s] for s in lengths}

    def _fitted(self, points: list[tuple[int, float, int]]) -> list[tuple[int, float, int]]:
        """The points the bucket's line is fitted through: the verifications alone where plain steps
        are streamed and two lengths of them are measured, else all. A streamed step costs no call, a
        verification of one token a call and a second token: drawn through the thousands of streamed
        steps and a few short verifications, the line's slope took the call for the cost of the tokens
        (measured at one stream on Q4_1: 6 ms a token where verifying 9 and 13 tokens cost 3), and
        priced every long draft out, so that no long draft was verified to correct it."""
        calls = [p for p in points if p[0] >= 1]
        return calls if self.plain_streams and len(calls) >= 2 else points

    def measured_anywhere(self, s: int) -> bool:
        """Whether length `s` has been measured at any load (and is remembered)."""
        return any(n == s and e.value is not None and self._remembered((b, n)) for (b, n), e in self.cells.items())

    def measured_lengths(self, batch: int) -> dict[int, int]:
        """The lengths measured at this load's own bucket (none borrowed), with their observation counts."""
        return {n: c for n, _, c in self._points(load_bucket(batch))}

    def _buckets_by_nearness(self, batch: int) -> list[int]:
        return buckets_by_nearness({b for b, n in self.cells if self._remembered((b, n))}, batch)

    def _points(self, bucket: int) -> list[tuple[int, float, int]]:
        """(length, seconds, observations) of each measured length of the bucket still remembered, by length."""
        return sorted((n, e.value, e.count) for (b, n), e in self.cells.items()
                      if b == bucket and e.value is not None and self._remembered((b, n)))

    def _smoothed(self, points: list[tuple[int, float, int]], line: tuple[float, float] | None) -> list[tuple[int, float]]:
        """Each length's seconds shrunk towards `line` by its observation count (as measured without one)."""
        if line is None:
            return [(n, t) for n, t, _ in points]
        return [(n, (c * t + self.shrink * (line[0] + line[1] * n)) / (c + self.shrink)) for n, t, c in points]

    def _relative_trend(self, batch: int) -> float:
        """Seconds per draft token relative to the level, of the nearest bucket with a trend (0: none)."""
        for bucket in self._buckets_by_nearness(batch):
            points = self._fitted(self._points(bucket))
            line = _line(points)
            if line is not None:
                return line[1] / max(sum(t for _, t, _ in points) / len(points), 1e-9)
        return 0.0


def _on_curve(points: list[tuple[int, float]], line: tuple[float, float] | None, relative: float, s: int) -> float:
    """Seconds at length s: between measured lengths, on the straight line joining them; beyond them,
    the line's slope from the edge (without a line, the nearest load's slope `relative` to the level)."""
    below = [p for p in points if p[0] <= s]
    above = [p for p in points if p[0] >= s]
    if below and above:
        (s0, t0), (s1, t1) = below[-1], above[0]
        return t0 if s1 == s0 else t0 + (t1 - t0) * (s - s0) / (s1 - s0)
    edge, t_edge = below[-1] if below else above[0]
    slope = line[1] if line is not None else t_edge * relative
    return max(t_edge + slope * (s - edge), 0.0)


def _line(points: Sequence[tuple[int, float, int]]) -> tuple[float, float] | None:
    """Least-squares (intercept, seconds per draft token), each length weighted by its count of
    observations, the slope never negative; None with fewer than two lengths."""
    if len(points) < 2:
        return None
    xs, ys, ns = (np.array(column, float) for column in zip(*points))
    slope, intercept = np.polyfit(xs, ys, 1, w=np.sqrt(ns))
    if slope < 0:  # flat: the weighted mean
        return float(np.average(ys, weights=ns)), 0.0
    return float(intercept), float(slope)


@dataclass
class AcceptanceModel:
    """a_j per draft position: decayed accept/trial counts, so old evidence fades."""

    decay: float
    accepted: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def observe(self, drafted: int, accepted: int) -> None:
        """Positions 1..accepted were accepted; position accepted + 1 (if drafted) was rejected."""
        seen = min(drafted, accepted + 1)
        while len(self.trials) < seen:
            self.trials.append(0.0)
            self.accepted.append(0.0)
        for j in range(seen):
            self.trials[j] = self.trials[j] * self.decay + 1.0
            self.accepted[j] = self.accepted[j] * self.decay + (1.0 if j < accepted else 0.0)

    def rate(self, j: int, prior: float, prior_weight: float) -> float:
        """Position j (0-based): the counts blended with `prior` worth `prior_weight` trials."""
        n = self.trials[j] if j < len(self.trials) else 0.0
        a = self.accepted[j] if j < len(self.accepted) else 0.0
        return (a + prior * prior_weight) / (n + prior_weight)


@dataclass
class LengthPolicy:
    """The selector's settings; deploy.yaml sets `candidates` (orchestrator.draft_length_candidates)."""

    candidates: tuple[int, ...] = DEFAULTS.draft_length_candidates
    margin: float = 0.05
    dwell: int = 3
    explore_every: int = 12
    initial: int = 4
    request_decay: float = 0.9
    global_decay: float = 0.98
    prior_weight: float = 0.5
    prior_acceptance: float = 0.5
    cost_memory_rounds: int = 512
    """A drafting cost that no round of any request has measured for this many rounds is forgotten
    (`DraftCosts`): one slow draft (an SSM that stalled, a stub being reloaded) priced drafting out
    for good, since a request that does not draft measures nothing."""
    verify_memory_rounds: int = 2048
    """A verified length's cost that no round has measured for this many rounds is forgotten
    (`VerifyCostTable.memory_rounds`), for the same reason. Longer than the drafting costs' memory:
    a table forgotten at one stream has its next probe's draft verified whole (one draft in about 20
    requests where chat verifies none)."""
    cost_seed_samples: int = 3
    """A drafting cost is unknown (taken as free) until this many rounds measured it, then starts from
    their median: its first sample alone, taken as it was, could be one stalled draft (`RobustCost`)."""
    cost_outlier_factor: float = 4.0
    cost_outlier_floor_s: float = 0.001
    """A sample moves a known drafting cost as if it were at most `cost_outlier_factor` times the
    cost (at least the floor's seconds a token, so that a cost near 0 can rise) and at least a
    `cost_outlier_factor`th of it: one draft that waited 100 times the usual, averaged in as it was,
    priced drafting out until the memory forgot it; a lasting change still moves it by that factor's
    share every round."""


DraftKey = tuple[tuple[str, ...], bool, int]
"""(the SSMs a request drafts with, whether its drafts are pipelined, the load bucket)."""


@dataclass
class RobustCost:
    """One drafting cost per token, robust to outliers: unknown (None) until `seed_samples` measures,
    then their median, then an exponential average of samples clipped to within `outlier_factor` of
    it (see `LengthPolicy.cost_outlier_factor`)."""

    seed_samples: int
    outlier_factor: float
    floor: float
    value: float | None = None
    count: int = 0
    seeds: list[float] = field(default_factory=list)

    def add(self, x: float, weight: float) -> None:
        self.count += 1
        if self.value is None:
            self.seeds.append(x)
            if len(self.seeds) >= self.seed_samples:
                self.value = float(np.median(self.seeds))
            return
        high = self.outlier_factor * max(self.value, self.floor)
        x = min(max(x, self.value / self.outlier_factor), high)
        self.value += weight * (x - self.value)


class DraftCosts:
    """Drafting seconds per token per `DraftKey`, each a `RobustCost` over the rounds that measured it,
    and forgotten once `cost_memory_rounds` rounds have passed without one: a request whose drafting
    looks too dear decodes plainly and drafts nothing, so an estimate too high would never be measured
    again. Forgotten, it is unknown (0, drafting taken as free) until the next measures set it."""

    def __init__(self, policy: LengthPolicy) -> None:
        self.policy = policy
        self.table: dict[DraftKey, RobustCost] = {}
        self.memory = RoundMemory(policy.cost_memory_rounds)
        """Each key's latest measure, in SharedLengthStats.rounds."""

    def __bool__(self) -> bool:
        return bool(self.table)

    def add(self, key: DraftKey, per_token: float, sample_weight: float, now: int) -> None:
        """A round's measure at round `now`; a forgotten key's average starts again from the next ones."""
        if key not in self.table or not self._remembered(key, now):
            policy = self.policy
            self.table[key] = RobustCost(policy.cost_seed_samples, policy.cost_outlier_factor,
                                         policy.cost_outlier_floor_s)
        self.table[key].add(per_token, sample_weight)
        self.memory.measured(key, now)

    def _remembered(self, key: DraftKey, now: int) -> bool:
        return self.memory.remembers(key, now)

    def nearest(self, batch: int, pipelined: bool, drafters: tuple[str, ...], now: int) -> float:
        """The value at the load bucket nearest `batch` among the drafters' known and measured within
        memory (0 when there is none)."""
        buckets = {b for (d, p, b), cost in self.table.items()
                   if (d, p) == (drafters, pipelined) and cost.value is not None and self._remembered((d, p, b), now)}
        for bucket in buckets_by_nearness(buckets, batch):
            return self.table[drafters, pipelined, bucket].value or 0.0
        return 0.0


class SharedLengthStats:
    """What all requests share, learnt from all their rounds: the LLM's cost table, drafting's cost per
    token and the acceptance per position."""

    def __init__(self, policy: LengthPolicy | None = None) -> None:
        self.policy = policy or LengthPolicy()
        self.probe_min_draft = DEFAULTS.probe_min_draft
        """Services sets its own (`Services.probe_min_draft`)."""
        self.verify = VerifyCostTable(memory_rounds=self.policy.verify_memory_rounds)
        self.acceptances: dict[tuple[str, ...], AcceptanceModel] = {}
        """The acceptance a_j per set of SSMs a request drafts with (the 0.5B's drafts are not the
        lookups'): t(b, s) is the LLM's, whoever drafted, but what is accepted depends on the drafters."""
        self.rounds = 0
        """Rounds observed, of every request: the clock the drafting costs' memory counts in."""
        self.draft_per_token = DraftCosts(self.policy)
        """Per (drafters, pipelined, load bucket): the drafting seconds per token that requests waited
        for. Apart per set of SSMs a request drafts with: a request that names a model SSM (Qwen's 0.5B:
        18 ms a token) priced the lookups' drafts of every later request at its own, which closed their
        probes for good (no probe, no new sample). Apart for pipelined requests, whose early drafts
        hide most of drafting: one estimate for both would price a pipelined request's drafting at what
        a plain one waits for."""
        self.probe_draft_per_token = DraftCosts(self.policy)
        """The same from drafts of at least `probe_min_draft` tokens, what a probe must find: the cost
        the probes are gated on (`probe_draft_estimate`). A lookup call costs about 2.5 ms whatever its
        length, so rounds of 1-token drafts (a request whose selector explores s = 1 from 0) put its
        cost per token above the gate and closed the probes that would have measured it again."""
        self.drafting: dict[str, int] = {}
        """Each request being decoded: its latest round's LLM work as a draft length (see `report`)."""
        self.longest: dict[str, int] = {}
        """Each request being decoded: the batch length at its longest since the request's last report or
        answer, what the passes its call went into held (`pass_length`)."""

    def report(self, request_id: str, drafted: int) -> None:
        """A request sends a call to the LLM now, as much work as a draft of this length: the tokens it
        puts through the LLM, less one (0 for plain decoding, the prompt's length for a prefill)."""
        self.drafting[request_id] = drafted
        now = self.batch_length(default=drafted)
        for other in self.longest:
            self.longest[other] = max(self.longest[other], now)
        self.longest[request_id] = now

    def forget(self, request_id: str) -> None:
        self.drafting.pop(request_id, None)
        self.longest.pop(request_id, None)

    def pass_length(self, request_id: str | None, default: int) -> int:
        """The batch length of the passes a request's latest answer measured: the longest since its call
        went out (or since its previous answer on a stream), not the one at the answer. A wave's prompts
        reported while a plain call was out share its pass, and by its answer their requests have
        reported their next, short rounds: read at the answer, a pass of eight prefills (2.6 s on
        deploy.torch.yaml) went into t(8, 0) as a plain step, and the wave crept up from s = 0 one
        length at a time (docs/adaptive-draft-length.md)."""
        if request_id is None or request_id not in self.longest:
            return self.batch_length(default)
        return self.longest[request_id]

    def answered(self, request_id: str) -> None:
        """A request's answer is observed: the passes its next answer measures start now."""
        if request_id in self.longest:
            self.longest[request_id] = self.batch_length(default=self.drafting.get(request_id, 0))

    def batch_length(self, default: int) -> int:
        """The mean draft length of the requests being decoded (`default` when none has reported)."""
        if not self.drafting:
            return default
        return round(sum(self.drafting.values()) / len(self.drafting))

    def acceptance_of(self, drafters: tuple[str, ...] = ()) -> AcceptanceModel:
        """The server-wide acceptance of drafts made with `drafters`."""
        return self.acceptances.setdefault(drafters, AcceptanceModel(self.policy.global_decay))

    @property
    def acceptance(self) -> AcceptanceModel:
        """`acceptance_of` a request that names no SSMs (the tests' selectors)."""
        return self.acceptance_of()

    def observe(self, batch: int, pipelined: bool, drafted: int, accepted: int, draft_seconds: float | None,
                verify_seconds: float, drafters: tuple[str, ...] = (), request_id: str | None = None) -> None:
        """One round of any request (fixed lengths and plain decoding too: the LLM's verification time
        and the SSMs' acceptance are the server's, whoever chose the length): its length, how much was
        accepted, what drafting (exposed) and verification cost. draft_seconds None: not
        representative (a request's first draft also pays the SSMs' prefill of the prompt, which
        would make drafting look many times dearer than it is).

        A pass whose mean work is longer than the longest candidate holds prompts' prefills: no choice
        of length makes it, so it is not put in t, where a few such far points would set the slope of
        the least-squares line by their leverage alone. `request_id`: whose round it is, so that the
        pass is the one its call went into (`pass_length`)."""
        self.rounds += 1
        length = self.pass_length(request_id, default=drafted)
        if length <= max(self.policy.candidates):
            self.verify.observe(batch, length, verify_seconds)
        if drafted > 0:
            self.acceptance_of(drafters).observe(drafted, accepted)
            if draft_seconds is not None:
                key, per_token = (drafters, pipelined, load_bucket(batch)), draft_seconds / drafted
                sample_weight = server_weight(self.verify.weight, batch)
                self.draft_per_token.add(key, per_token, sample_weight, self.rounds)
                if drafted >= self.probe_min_draft:
                    self.probe_draft_per_token.add(key, per_token, sample_weight, self.rounds)

    def draft_estimate(self, batch: int, pipelined: bool, drafters: tuple[str, ...] = ()) -> float:
        """Drafting seconds per token with these SSMs at this load, from the nearest measured load (0
        before any, or once forgotten)."""
        return self.draft_per_token.nearest(batch, pipelined, drafters, self.rounds)

    def probe_draft_estimate(self, batch: int, pipelined: bool, drafters: tuple[str, ...] = ()) -> float:
        """`draft_estimate` over drafts as long as a probe's must be (0 before any, or once forgotten)."""
        return self.probe_draft_per_token.nearest(batch, pipelined, drafters, self.rounds)

    def global_rates(self, n: int, drafters: tuple[str, ...] = ()) -> list[float]:
        """Server-wide a_0 .. a_{n-1}. Each position's counts are blended with the rate of the position
        before it (worth one trial), the first with `prior_acceptance`: a position that drafts seldom
        reach is taken to be accepted about as often as the one before it (acceptance changes smoothly
        along a draft), not as often as an uninformed prior. Pulled towards 0.5 instead, the rare long
        drafts' positions made every draft beyond 8 look worse than it measures."""
        rates, prior, acceptance = [], self.policy.prior_acceptance, self.acceptance_of(drafters)
        for j in range(n):
            prior = acceptance.rate(j, prior, 1.0)
            rates.append(prior)
        return rates

