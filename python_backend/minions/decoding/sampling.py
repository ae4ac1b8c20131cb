"""Turning one row of logits into the distribution the LLM samples from.

The same function serves plain decoding and draft verification, which is what makes speculative
sampling lossless: a draft token is judged against exactly the distribution that plain decoding
would have drawn from (temperature, then top-k, then top-p, after banned tokens are masked).
A seeded request draws the token at each sequence position from a generator keyed by its seed and
that position (`SeededDraws`), and a draft token is judged by the same draw (verification.py), so a
seeded request repeats its tokens whatever its rounds and drafts look like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling knobs, with the TensorRT-LLM meaning of each.

    temperature 0 (or top_k 1) means greedy decoding; top_k 0 disables top-k; top_p 1 disables top-p.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


GREEDY = SamplingParams()


def masked_logits(logits: np.ndarray, banned: list[int] | None) -> np.ndarray:
    """Return logits with banned token ids set to -inf (a copy only when something is banned)."""
    if not banned:
        return logits
    out = np.array(logits, dtype=np.float64, copy=True)
    out[banned] = -np.inf
    return out


def greedy_token(logits: np.ndarray, banned: list[int] | None = None) -> int:
    """Argmax with ties broken towards the lower id, as torch.argmax and numpy.argmax both do."""
    return int(np.argmax(masked_logits(logits, banned)))


def target_probs(logits: np.ndarray, params: SamplingParams, banned: list[int] | None = None) -> np.ndarray:
    """The distribution p that plain sampling draws from, as float64 summing to 1.

    Order follows HF/TensorRT-LLM: temperature scaling, then top-k, then top-p (nucleus: the smallest
    set of most likely tokens whose mass reaches top_p, the token that crosses it included).
    """
    z = np.asarray(masked_logits(logits, banned), dtype=np.float64)
    if params.greedy:
        probs = np.zeros_like(z)
        probs[int(np.argmax(z))] = 1.0
        return probs
    z = z / params.temperature
    if 0 < params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z >= kth, z, -np.inf)
    z = z - np.max(z)
    probs = np.exp(z)
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep_count = int(np.searchsorted(cumulative, params.top_p, side="left")) + 1
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[:keep_count]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def log_prob(logits: np.ndarray, token: int) -> float:
    """The model's own log probability of `token` (log-softmax of the raw logits: no temperature,
    penalties or truncation), what tensorrt_llm's `output_log_probs` report here."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max()
    return float(z[token] - top - np.log(np.exp(z - top).sum()))


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from an (unnormalised is fine) non-negative vector by inverse CDF."""
    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    return int(min(np.searchsorted(cumulative, u, side="right"), len(probs) - 1))


def pick_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, banned: list[int] | None = None) -> int:
    """The token plain decoding emits from one row of logits: argmax when greedy, else a draw from p."""
    if params.greedy:
        return greedy_token(logits, banned)
    return draw(target_probs(logits, params, banned), rng)


def request_seed(seed: int | None, random_seed: int | None) -> int | None:
    """A request's seed from tensorrt_llm's `seed`, else its older name `random_seed`: the one rule of
    both interfaces' parsers (the `minions` model's and the engine models')."""
    return seed if seed is not None else random_seed


class SeededDraws:
    """A seeded request's draws: one generator per sequence position, keyed by the seed and the
    position, so that the token drawn at a position does not depend on how many draws came before it
    (which rounds, which drafts: drafters that learn from finished requests propose otherwise when a
    request comes again)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def at(self, position: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, position])


Randomness = np.random.Generator | SeededDraws
"""Where a call's draws come from: position-keyed for a seeded request, one stream of fresh entropy
otherwise."""


def request_randomness(seed: int | None) -> Randomness:
    """A call's draws: keyed by `seed` and position when there is a seed, fresh entropy otherwise (the
    engines' prefix caches may then serve the call, engines/prefix_cache.py)."""
    return np.random.default_rng() if seed is None else SeededDraws(seed)


def generator_at(randomness: Randomness, position: int) -> np.random.Generator:
    """The generator that draws the token at sequence index `position`."""
    return randomness.at(position) if isinstance(randomness, SeededDraws) else randomness


def derived_seed(seed: int | None, *keys: int) -> int | None:
    """A uint64 seed derived from `seed` and `keys` (None without a seed): the SSMs' draws use
    `derived_seed(seed, DRAFT_STREAM)`, independent of the LLM's; TensorRT-LLM's own models, which
    restart their generator at each call, get one per call (`native_seed`)."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1, np.uint64)[0])


DRAFT_STREAM = 1
"""The key of an SSM's draws (derived_seed): the LLM's use the request's seed itself."""
NATIVE_CALL = 2
"""The key of a seed per call to TensorRT-LLM's own model (native_seed)."""


def native_seed(seed: int | None, position: int) -> int | None:
    """The seed sent to TensorRT-LLM's own model for a call that starts at sequence index `position`:
    its sampler draws from one generator seeded per call, so each call needs a seed of its own."""
    return derived_seed(seed, NATIVE_CALL, position)
