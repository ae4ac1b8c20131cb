"""Where two greedy outputs of one prompt part ways, how close the LLM's top two tokens were.

llama.cpp computes a step of many tokens (a verification, a batch of sequences) with other kernels than
a one-token step, so a greedy token whose logit barely beats the runner-up may flip. A divergence from
`off` is acceptable only at such a near tie: this finds the first token where two texts differ and
scores it with the deployment's LLM engine alone, in process (the reference computation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.decoding.tokens import common_prefix_len
from minions.deploy.artifacts import tokenizer_dir_for
from minions.deploy.config import Deployment
from minions.deploy.render import engine_settings
from minions.engines.factory import build_engine
from minions.settings import DEFAULTS
from minions.text.prompt import encode_prompt


@dataclass(frozen=True)
class Divergence:
    position: int
    """Output tokens before the first difference."""
    expected: int
    got: int
    gap: float
    """The reference logit of `expected` minus that of `got` (>= 0 when `expected` is the argmax)."""

    def __str__(self) -> str:
        return f"token {self.position}: {self.got} instead of {self.expected}, logit gap {self.gap:.4f}"


class NearTieChecker:
    """The deployment's LLM engine and tokenizer, loaded once, to score divergences."""

    def __init__(self, dep: Deployment) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir_for(dep.llm["source"], dep))
        self.engine = build_engine(engine_settings(dep.llm, dep, DEFAULTS))

    def divergence(self, prompt: str, reference: str, other: str) -> Divergence | None:
        """The first token where `other` leaves `reference` (both greedy outputs of the chat prompt)."""
        ids = encode_prompt(self.tokenizer, prompt, chat=True)
        want = self.tokenizer.encode(reference, add_special_tokens=False)
        got = self.tokenizer.encode(other, add_special_tokens=False)
        i = common_prefix_len(want, got)
        if i == len(want) or i == len(got):
            return None
        result = self.engine.generate(EngineRequest("near-tie", ids + want[:i], 1, return_generation_logits=True))
        self.engine.release("near-tie")
        row = np.asarray(result.logits)[0]
        return Divergence(i, want[i], got[i], float(row[want[i]] - row[got[i]]))
