"""The LLM's verification cost t(b, s) per load and draft length (`VerifyCostTable`), and the
primitives every server-wide statistic of the adaptive length shares: load buckets, the weight of one
request's observation, moving averages and the memory of when a cost was last measured."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


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
    measures one, and a table whose costs price every draft out sees none (one cold, slow verification
    cuts even likely drafts to nothing), so without forgetting a server can stay plain for good
    (docs/experiments.md, "Open: a fresh server that stopped drafting for good")."""
    cells: dict[tuple[int, int], Ema] = field(default_factory=dict)
    restarts: dict[int, Ema] = field(default_factory=dict)
    """Per load bucket: seconds from a plain stream's restart (a call after the request's first) to its
    first token (`observe_restart`)."""
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

    def observe_restart(self, batch: int, seconds: float) -> None:
        """A plain stream started again after the request's first call (a verification or a drafting
        round came between) sent its first token `seconds` after the call."""
        self.restarts.setdefault(load_bucket(batch), Ema(self.weight)).add(seconds, server_weight(self.weight, batch))

    def restart_extra(self, batch: int, step: float | None) -> float:
        """Seconds that stopping a plain stream and starting it again adds to a verification, beyond t(b, k):
        the restarted stream's first token takes a call's round trip besides its step, where the stream
        would have gone on at a step a token (`step`: t(b, 0) as the caller priced it; 0 until both are
        measured). A probe's draft pays for it."""
        for bucket in buckets_by_nearness(set(self.restarts), batch):
            first = self.restarts[bucket].value
            return 0.0 if step is None or first is None else max(first - step, 0.0)
        return 0.0

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
        """`estimates` for pricing one draft by its own chances (pricing/worth.py, worth_verifying), with
        the measured lengths' reach doubled: beyond the longest measured at this load, lengths up to
        twice it cost what it costs, and longer ones rise from there at the line's slope. Beyond the
        measured lengths the line is a guess, and a draft it prices out is never verified to measure
        it (a line through two short, cold verifications can price every long copy out for good:
        docs/benchmarks.md). Priced so, a draft whose chances are good goes further, is measured, and
        the reach doubles (4, 8, 16), as the length policy steps one candidate beyond its measured
        lengths (`trusted_lengths`)."""
        edge = max(self.measured_lengths(batch), default=0)
        costs = self.estimates(batch, sorted({*lengths, edge, 2 * edge}))
        at_edge = costs[edge]
        if edge == 0 or at_edge is None:
            return {s: costs[s] for s in lengths}
        lift = costs[2 * edge] - at_edge  # what the line adds over the doubled reach
        return {s: max(at_edge, costs[s] - lift) if s > edge else costs[s] for s in lengths}

    def trusted_lengths(self, batch: int, *, candidates: Sequence[int], current: int,
                        costs: Mapping[int, float | None], margin: float) -> list[int]:
        """The candidate lengths whose estimate a length policy acts on: those up to the longest measured
        at this load (or up to `current`, at a load not measured yet), and one candidate beyond, only
        while the cost still falls towards that edge: the edge beats the nearest shorter length measured
        `shrink` times or more by `margin`, as a line search widens its bracket (an interpolated length
        between them would only echo the straight line drawn through it). Further out t(b, s) is an
        extrapolation, and under load it is most wrong there: the LLM's queue makes verification grow
        faster than linearly. Every request steps together, and a step's cost is seen only once taken.
        `costs`: J at every length up to the longest candidate (DraftLengthSelector._costs)."""
        counts = {n: c for n, c in self.measured_lengths(batch).items() if n <= candidates[-1]}
        top = max(counts, default=current)
        inside = [s for s in candidates if s <= top]
        beyond = [s for s in candidates if s > top]
        trusted = [*inside, current]
        shorter = [n for n, c in counts.items() if n < top and c >= self.shrink]
        if beyond and not shorter:
            trusted.append(beyond[0])
        elif beyond:
            edge, before = costs[top], costs[max(shorter)]
            if edge is not None and before is not None and edge < (1.0 - margin) * before:
                trusted.append(beyond[0])
        return trusted

    def _fitted(self, points: list[tuple[int, float, int]]) -> list[tuple[int, float, int]]:
        """The points the bucket's line is fitted through: the verifications alone where plain steps
        are streamed and two lengths of them are measured, else all. A streamed step costs no call, a
        verification of one token a call and a second token: a line through thousands of streamed
        steps and a few short verifications would read the call's cost as the tokens' slope and price
        every long draft out, so that none is verified to correct it."""
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
