"""Repetition, presence and frequency penalties and `min_tokens`: what a request changes in the LLM's
logits before a token is picked, with vLLM's (and OpenAI's) meaning of each.

The same function serves plain decoding and every row of a draft's verification, each row given the
sequence up to its own position, which keeps speculation lossless: the verifier judges a draft token
against exactly the distribution plain decoding would have used at that position. Drafts are made
without penalties (the SSMs never see them), which costs acceptance, not exactness.

- repetition_penalty r (1 = none): a token anywhere in the prompt or output has its logit divided by r
  when positive and multiplied by r when not (CTRL's rule, as vLLM and TensorRT-LLM apply it);
- presence_penalty a and frequency_penalty f (0 = none): a token that occurs c > 0 times in the
  output loses a + f * c (OpenAI's rule; the prompt is not counted, as in vLLM);
- min_tokens m: end_id cannot be picked while the output holds fewer than m tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from minions.errors import InvalidRequest


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    min_tokens: int = 0
    prompt_length: int = 0
    """How many leading tokens of the sequence are the prompt; the rest is output. An engine call
    without it counts its whole input_ids as the prompt, as tensorrt_llm does (engines/tensors.py)."""

    def checked(self) -> Penalties:
        """Itself, or InvalidRequest naming the input (tensorrt_llm's names) that is out of range."""
        if not np.isfinite(self.repetition) or self.repetition <= 0:
            raise InvalidRequest(f"'repetition_penalty' must be > 0 (1 = none), got {self.repetition}")
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not np.isfinite(value):
                raise InvalidRequest(f"{name!r} must be a finite number (0 = none), got {value}")
        if self.min_tokens < 0:
            raise InvalidRequest(f"'min_tokens' must be >= 0, got {self.min_tokens}")
        return self

    @property
    def neutral(self) -> bool:
        return self.repetition == 1.0 and self.presence == 0.0 and self.frequency == 0.0 and self.min_tokens <= 0

    def apply(self, logits: np.ndarray, sequence: Sequence[int], end_id: int | None) -> np.ndarray:
        """`logits` for the token after `sequence` as the request's penalties change them (the array itself
        when they change nothing)."""
        if self.neutral:
            return logits
        out = np.array(logits, dtype=np.float64, copy=True)
        if self.repetition != 1.0 and len(sequence):
            seen = np.unique(np.asarray(sequence, dtype=np.int64))
            values = out[seen]
            out[seen] = np.where(values > 0, values / self.repetition, values * self.repetition)
        output = np.asarray(sequence[self.prompt_length:], dtype=np.int64)
        if (self.presence or self.frequency) and output.size:
            ids, counts = np.unique(output, return_counts=True)
            out[ids] -= self.presence + self.frequency * counts
        if end_id is not None and output.size < self.min_tokens:
            out[end_id] = -np.inf
        return out


NO_PENALTIES = Penalties()
