"""What one request has produced so far, advanced by every round of its decode loop (loop.py),
verified or streamed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Progress:
    """A request's sequence, its tokens so far against its budget, and whether it has ended."""

    sequence: list[int]
    """The prompt and every token emitted: what the LLM continues."""
    max_new_tokens: int
    end_id: int | None
    produced: int = 0
    index: int = 0
    """Rounds so far."""
    emitted: list[int] = field(default_factory=list)
    """The last round's tokens."""
    ended: bool = False
    """end_id was emitted."""

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.produced

    @property
    def finished(self) -> bool:
        return self.ended or self.produced >= self.max_new_tokens

    def advance(self, tokens: list[int]) -> bool:
        """Add one round's tokens; True once max_new_tokens or end_id is reached (no round follows)."""
        self.emitted = tokens
        self.sequence += tokens
        self.produced += len(tokens)
        self.index += 1
        self.ended = self.end_id is not None and self.end_id in tokens
        return self.finished
