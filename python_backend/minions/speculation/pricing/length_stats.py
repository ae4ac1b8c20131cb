"""What the adaptive draft-length selector learns from every request's rounds (see draft_length.py
for the cost model) beside the LLM's verification cost (verify_costs.py): drafting's cost per token
(`DraftCosts`) and the acceptance a_j per draft position (`AcceptanceModel`). `SharedLengthStats`
holds the server-wide ones; `LengthPolicy` the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minions.settings import DEFAULTS
from minions.speculation.pricing.verify_costs import (RoundMemory, VerifyCostTable, buckets_by_nearness, load_bucket,
                                              server_weight)


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

    def __init__(self, policy: LengthPolicy | None = None, probe_min_draft: int = DEFAULTS.probe.min_draft) -> None:
        self.policy = policy or LengthPolicy()
        self.probe_min_draft = probe_min_draft
        """The deployment's `probe_min_draft`: the drafts a probe must find, whose costs gate the probes."""
        self.verify = VerifyCostTable(memory_rounds=self.policy.verify_memory_rounds)
        self.acceptances: dict[tuple[str, ...], AcceptanceModel] = {}
        """The acceptance a_j per set of SSMs a request drafts with (the 0.5B's drafts are not the
        lookups'): t(b, s) is the LLM's, whoever drafted, but what is accepted depends on the drafters."""
        self.rounds = 0
        """Rounds observed, of every request: the clock the drafting costs' memory counts in."""
        self.draft_per_token = DraftCosts(self.policy)
        """Per (drafters, pipelined, load bucket): the drafting seconds per token that requests waited
        for. Apart per set of SSMs a request drafts with: one estimate would let a request that names a
        model SSM (many times a lookup's cost a token) price every later request's lookup drafts at its
        own, closing their probes for good (no probe, no new sample). Apart for pipelined requests, whose early drafts
        hide most of drafting: one estimate for both would price a pipelined request's drafting at what
        a plain one waits for."""
        self.probe_draft_per_token = DraftCosts(self.policy)
        """The same from drafts of at least `probe_min_draft` tokens, what a probe must find: the cost
        the probes are gated on (`probe_draft_estimate`). A lookup call costs about the same whatever its
        length, so rounds of 1-token drafts (a request whose selector explores s = 1 from 0) would put
        its cost per token above the gate and close the probes that would measure it again."""
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

