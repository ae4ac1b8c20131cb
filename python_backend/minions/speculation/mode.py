"""How a request is decoded: its speculation mode and the SSMs it drafts with, and the one parser
of the `speculation` strings that requests and deploy.yaml use."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from minions.errors import InvalidRequest


class SpeculationMode(StrEnum):
    OFF = "off"
    """Plain LLM decoding."""
    SINGLE = "single"
    """One SSM drafts."""
    VOTE = "vote"
    """Every listed SSM drafts; a weighted vote picks the draft."""
    BANDIT = "bandit"
    """A learnt policy picks one SSM per round."""


@dataclass(frozen=True)
class Speculation:
    """`off`, `single:<ssm>`, `vote` / `vote:<ssm>,<ssm>...`, `bandit` / `bandit:<ssm>,...`."""

    mode: SpeculationMode
    ssms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", SpeculationMode(self.mode))

    @classmethod
    def parse(cls, text: str, known_ssms: tuple[str, ...]) -> Speculation:
        """The mode a string names, its SSMs checked against the served ones (InvalidRequest if not)."""
        text = text.strip()
        if text == SpeculationMode.OFF:
            return cls(SpeculationMode.OFF)
        kind, sep, names = text.partition(":")
        listed = tuple(n.strip() for n in names.split(",")) if sep else ()
        drafting = kind in (SpeculationMode.SINGLE, SpeculationMode.VOTE, SpeculationMode.BANDIT)
        unknown = [n for n in listed if n not in known_ssms]
        if drafting and unknown:
            raise InvalidRequest(f"unknown SSM {unknown[0]!r} in speculation {text!r}; known: {', '.join(known_ssms)}")
        if kind == SpeculationMode.SINGLE and len(listed) == 1:
            return cls(SpeculationMode.SINGLE, listed)
        if kind in (SpeculationMode.VOTE, SpeculationMode.BANDIT) and (listed or known_ssms):
            return cls(SpeculationMode(kind), tuple(dict.fromkeys(listed)) if listed else known_ssms)
        choices = ["off", "vote", "bandit"] + [f"single:{n}" for n in known_ssms]
        raise InvalidRequest(f"unknown speculation {text!r}; use one of: {', '.join(choices)}")

    @property
    def drafts(self) -> bool:
        """Whether any SSM drafts (not `off`, and at least one SSM)."""
        return self.mode != SpeculationMode.OFF and bool(self.ssms)

    def __str__(self) -> str:
        return str(self.mode) if self.mode == SpeculationMode.OFF else f"{self.mode}:{','.join(self.ssms)}"

    @property
    def label(self) -> str:
        """Short name for metrics and logs: `vote`, not `vote:a,b,c`."""
        return str(self) if self.mode == SpeculationMode.SINGLE else str(self.mode)


OFF = Speculation(SpeculationMode.OFF)
