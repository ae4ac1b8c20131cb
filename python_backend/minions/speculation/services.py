"""The server-wide services every request's decode loop shares (`Services`, built once by the
orchestrator): SSM health, the vote's weights, the bandit, the length statistics, the draft pool."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from minions.settings import DEFAULTS, OrchestratorSettings
from minions.speculation.bandit import BanditDrafter, Ucb1
from minions.speculation.decode_request import DecodeRequest
from minions.speculation.drafters import Drafter, SingleDrafter
from minions.speculation.health import SsmHealth
from minions.speculation.mode import SpeculationMode
from minions.speculation.pool import DraftPool
from minions.speculation.pricing.length_stats import LengthPolicy, SharedLengthStats
from minions.speculation.vote_drafter import VoteDrafter
from minions.speculation.watch import DraftRest, ProbeSchedule, TailRepeats
from minions.speculation.weights import SsmWeights


@dataclass
class Services:
    """What every request shares, learnt or throttled server-wide: a dead SSM is skipped by everyone,
    the vote's weights and the bandit learn from every request, the length statistics price every
    request's choice, the pool throttles everyone's drafting."""

    ssms: tuple[str, ...]
    settings: OrchestratorSettings = DEFAULTS
    """The deployment's settings, held rather than copied: the probes', the pipeline's, the vote's and
    the streams' knobs are read from here (settings.py documents each)."""
    health: SsmHealth = field(default_factory=SsmHealth)
    weights: SsmWeights | None = None
    """The vote's global SSM weights (None: fresh ones over `ssms`)."""
    bandit: Ucb1 | None = None
    """The bandit's arm statistics (None: fresh ones over `ssms`)."""
    length_stats: SharedLengthStats | None = None
    """The server's length statistics (None: fresh ones, from the settings)."""
    pool: DraftPool | None = None
    """The intermediate draft pool (None: no throttle)."""
    load: Callable[[], int] = lambda: 1
    """How many requests are being decoded now (the batch size the LLM sees)."""
    llm_streams: bool = False
    """The LLM streams a generation token by token from one call (a decoupled in-flight engine):
    plain decoding then costs one engine step per token, not one call."""
    llm_stops_streams: bool = True
    """A `stop` ends the LLM's running stream (a llama.cpp engine; not TensorRT-LLM's); else plain
    decoding of a request that drafts streams `plain_stretch_tokens` a call."""
    confident_ssms: frozenset[str] = frozenset()
    """SSMs whose drafts carry their tokens' estimated chances (settings.lookup_model_names): asked for
    them, and their drafts cut to the length worth verifying (`worth_verifying`)."""
    on_probe: Callable[[str], None] = lambda outcome: None
    """Told how each probe of a plain stream ended (watch.py's PROBE_OUTCOMES): the orchestrator
    counts them for its metrics."""

    def __post_init__(self) -> None:
        self.length_stats = self.length_stats or SharedLengthStats(probe_min_draft=self.settings.probe.min_draft)
        self.length_stats.verify.plain_streams = self.llm_streams  # t(b, 0) is a streamed step, no call
        self.weights = self.weights or SsmWeights(self.ssms)
        self.bandit = self.bandit or Ucb1(self.ssms)

    @property
    def llm(self) -> str:
        return self.settings.llm_model_name

    @classmethod
    def from_settings(cls, settings: OrchestratorSettings, load: Callable[[], int]) -> Services:
        """The orchestrator's services, built once from its deployment settings."""
        return cls(
            ssms=settings.ssm_model_names,
            settings=settings,
            health=SsmHealth.of(settings.ssm_health),
            length_stats=SharedLengthStats(LengthPolicy(candidates=settings.draft_length_candidates),
                                           probe_min_draft=settings.probe.min_draft),
            pool=DraftPool(settings.draft_pool),
            load=load,
            llm_streams=settings.llm_model_name in settings.decoupled_model_names,
            llm_stops_streams=settings.llm_model_name not in settings.trtllm_model_names,
            confident_ssms=frozenset(settings.lookup_model_names),
        )

    def add_ssm(self, name: str) -> None:
        """An SSM model loaded into the repository while the orchestrator runs joins the served ones."""
        if name not in self.ssms:
            self.ssms = (*self.ssms, name)
            self.weights.add(name)
            self.bandit.add(name)

    def drafter(self, request: DecodeRequest) -> Drafter | None:
        """The request's drafter (None: plain decoding)."""
        spec, sampled = request.speculation, request.sampled_drafts
        if not spec.drafts:
            return None
        if spec.mode == SpeculationMode.VOTE:
            lookups = set(spec.ssms) & self.confident_ssms
            rest = self.draft_rest() if lookups and lookups != set(spec.ssms) else None
            return VoteDrafter(spec.ssms, self.health, self.weights, deadline_s=self.settings.vote.deadline_s,
                               explore_every=self.settings.vote.explore_every, sampled=sampled, rest=rest,
                               ahead=lambda: self.load() <= self.settings.probe.max_load)
        if spec.mode == SpeculationMode.BANDIT:
            return BanditDrafter(spec.ssms, self.health, self.bandit, sampled)
        return SingleDrafter(spec.ssms[0], self.health, sampled)

    def probe_schedule(self, from_start: bool = False) -> tuple[ProbeSchedule, TailRepeats | None]:
        """A fresh schedule of one request's asks and its index of repeating tails (None when off): the
        probes on its plain streams (DraftWatch; `from_start`: the first comes `first_gap` tokens into
        the answer) and its rests (DraftRest)."""
        probe = self.settings.probe
        repeats = TailRepeats(probe.repeat_tokens) if probe.repeat_tokens > 0 else None
        return ProbeSchedule(probe.min_gap, probe.max_gap, probe.first_gap if from_start else None), repeats

    def draft_rest(self) -> DraftRest:
        """When a request's lookups are asked where each ask precedes an LLM call (watch.DraftRest): on
        the probes' schedule, a fresh one per request."""
        return DraftRest(*self.probe_schedule())

    def stream_interval_s(self, interval_s: float, batch: int) -> float:
        """A streamed call's interval between responses with `batch` requests decoding: the request's
        (`interval_s`; 0, every token, is kept), or longer, so that `batch` streams send at most
        `llm_stream.max_responses_per_s` together. Each response costs CPU in both stubs, tritonserver
        and the frontend, which llama.cpp's threads would otherwise use (docs/engines.md)."""
        most = self.settings.llm_stream.max_responses_per_s
        if interval_s <= 0 or most <= 0:
            return interval_s
        return max(interval_s, batch / most)
