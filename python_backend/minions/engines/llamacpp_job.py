"""One call in progress in the llama.cpp engine's in-flight batch (llamacpp_engine.LlamaCppStepper)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.decoding.sampling import Randomness
from minions.engines.sequence_cache import CachedSequence


@dataclass
class LlamaCppJob:
    """One call in progress: its slot, the tokens still to evaluate, and what it has produced."""

    request: EngineRequest
    entry: CachedSequence[int]
    sequence: list[int]
    pending: list[int]
    rng: Randomness
    draft: list[int] = field(default_factory=list)
    """A verification's draft (the last len(draft) pending tokens of its one step)."""
    tokens: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cached: int = 0
    """Tokens of the input found in the slot's cache."""
    streamed: int = 0
    """Tokens already reported by `partial`."""
    error: Exception | None = None

    @property
    def logit_rows(self) -> int:
        """Positions whose logits the next step must return: every draft position and the one after."""
        return len(self.draft) + 1
