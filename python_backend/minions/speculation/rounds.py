"""What each round of the decode loop reports (`Round`) and what a request's rounds add up to (`DecodeStats`).

A round is what one turn of the loop emits: a verification (its accepted draft and the LLM's own
token) or one streamed plain token. Rounds are not LLM calls: a streamed stretch is one call and
many rounds, which is why both are counted."""

from __future__ import annotations

from dataclasses import dataclass, field

from minions.decoding.tokens import common_prefix_len


@dataclass(kw_only=True)
class Round:
    """One round of a request: a verification, or one streamed plain token, and what it emitted."""

    tokens: list[int]
    """Emitted this round: the accepted draft tokens and the LLM's own token."""
    ssm: str | None
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    failed: tuple[str, ...] = ()
    """SSMs that failed or missed the deadline this round (the round went on without them)."""
    last: bool = False
    """No round follows (max_new_tokens or end_id reached): the consumer can finish its stream
    before the generator's clean-up releases the engines' state."""
    drafts: dict[str, list[int]] = field(default_factory=dict)
    """Each SSM's own draft this round (several under a vote)."""
    control_seconds: float = 0.0
    """Time spent in voting, weight updates and SSM selection (not waiting for engines)."""
    planned: int = 0
    """The draft length chosen for this round (the draft may be shorter: an SSM may stop early)."""
    pipelined: bool = False
    """The draft was made during the previous round's verification."""
    early_discarded: bool = False
    """An early draft for the next round was made during this round and thrown away."""
    log_probs: list[float] | None = None
    """The LLM's log probability of each emitted token, when the request asks for them."""
    llm_call: bool = True
    """This round began an LLM call: every verification, and a streamed stretch's first token."""
    cached_tokens: int = 0
    """Tokens of the prompt the LLM found cached (a prefix of an earlier request's), reported by the
    request's first round (the first LLM call always asks; `loop._cached`)."""

    def ssm_matched(self) -> dict[str, int]:
        """Per SSM: how many of its own draft tokens the LLM's output confirms."""
        return {ssm: common_prefix_len(d, self.tokens) for ssm, d in self.drafts.items()}


@dataclass
class DecodeStats:
    """What a request's speculation achieved; mirrors TensorRT-LLM's perf-metric outputs."""

    rounds: int = 0
    """Verifications and streamed plain tokens."""
    llm_calls: int = 0
    """Calls to the LLM: verifications and streamed stretches."""
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    control_seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    call_draft_lengths: list[int] = field(default_factory=list)
    """The draft tokens each LLM call verified, in order (0: a plain call, round 1's or a streamed stretch)."""
    pipelined_drafts: int = 0
    discarded_early_drafts: int = 0

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.llm_calls += r.llm_call
        if r.llm_call:
            self.call_draft_lengths.append(r.drafted)
        self.pipelined_drafts += r.pipelined
        self.discarded_early_drafts += r.early_discarded
        self.emitted_tokens += len(r.tokens)
        self.draft_seconds += r.draft_seconds
        self.verify_seconds += r.verify_seconds
        self.control_seconds += r.control_seconds
        if r.drafted:
            self.drafts += 1
            self.draft_tokens += r.drafted
            self.accepted_tokens += r.accepted
            if len(self.accepted_per_position) < r.drafted:
                self.accepted_per_position += [0] * (r.drafted - len(self.accepted_per_position))
            for pos in range(r.accepted):
                self.accepted_per_position[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
