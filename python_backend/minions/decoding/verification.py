"""Verifying a draft against the LLM's logits: the exactness rules of speculative decoding.

Given the LLM's logits at the k+1 positions a draft of k tokens exposes, return the accepted prefix of
the draft plus one token of the LLM's own (a correction on rejection, a bonus when all pass), exactly
like TensorRT-LLM's draft-tokens-external mode.

Greedy: accept while the draft token equals the argmax, then append the argmax. Output is identical to
plain greedy decoding.

Sampling with a deterministic draft token d: draw a token t from p, the LLM's adjusted distribution
(see sampling.target_probs), exactly as plain decoding would at that position, and accept d when
t == d. That accepts d with probability p(d) and, on rejection, emits t, whose law is p with d removed
and renormalised: the emitted token has law p exactly. And it is the very token plain decoding draws,
so a seeded request (whose draw at a position is fixed, sampling.SeededDraws) emits the same tokens
whatever it was drafted.

Sampling with a sampled draft (the SSM drew d from its own distribution q and sent its logits, as
TensorRT-LLM's `draft_logits`): accept with probability min(1, p(d) / q(d)); on rejection draw from
norm(max(0, p - q)). Also exact, and it accepts far more often than a greedy draft when q is close
to p. q is computed from the draft logits with the same temperature/top-k/top-p as p, which is the
distribution the SSM must have sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import Randomness, SamplingParams, draw, generator_at, greedy_token, target_probs
from minions.text.bad_words import BadWords


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]
    """Accepted draft tokens followed by the LLM's own token (truncated at end_id)."""
    num_accepted: int
    """How many draft tokens were accepted."""


def verify_draft(
    logits: np.ndarray,
    draft: Sequence[int],
    params: SamplingParams,
    rng: Randomness | None = None,
    context: Sequence[int] = (),
    bad_words: BadWords | None = None,
    end_id: int | None = None,
    draft_logits: np.ndarray | None = None,
    penalties: Penalties = NO_PENALTIES,
) -> Verdict:
    """Apply the accept/resample rule row by row.

    logits: shape [len(draft) + 1, vocab]; row i is the LLM's prediction for draft position i (row
    len(draft) predicts the token after a fully accepted draft). context: the tokens before the draft,
    needed for multi-token bad words and penalties, and to key a seeded request's draws by position
    (row i draws for position len(context) + i). draft_logits: [len(draft), vocab], the SSM's
    logits when it sampled its draft (ignored for greedy decoding, where the draft is judged by argmax
    alone). penalties change each row as plain decoding would at that position; never the draft's rows.
    """
    if logits.shape[0] != len(draft) + 1:
        raise ValueError(f"need {len(draft) + 1} logit rows for a draft of {len(draft)}, got {logits.shape[0]}")
    if not params.greedy and rng is None:
        raise ValueError("sampling needs a random generator")
    if draft_logits is not None and (draft_logits.shape[0] < len(draft) or draft_logits.shape[-1] != logits.shape[-1]):
        raise ValueError(f"draft_logits of shape {list(draft_logits.shape)} do not fit {len(draft)} tokens "
                         f"over a vocabulary of {logits.shape[-1]}")
    track = bool(bad_words) or not penalties.neutral
    history = list(context) if track else []  # whole context: a bad word can be any length
    tokens: list[int] = []
    for i in range(len(draft) + 1):
        banned = bad_words.banned_next(history) if bad_words else None
        proposal = int(draft[i]) if i < len(draft) else None
        q_row = draft_logits[i] if draft_logits is not None and proposal is not None else None
        row = penalties.apply(logits[i], history, end_id)
        generator = None if rng is None else generator_at(rng, len(context) + i)
        token, accepted = _judge(row, proposal, params=params, rng=generator, banned=banned, draft_row=q_row)
        tokens.append(token)
        if end_id is not None and token == end_id:
            return Verdict(tokens, i + int(accepted))
        if not accepted:
            return Verdict(tokens, i)
        if track:
            history.append(token)
    return Verdict(tokens, len(draft))


def _judge(
    row: np.ndarray,
    proposal: int | None,
    params: SamplingParams,
    rng: np.random.Generator | None,
    banned: list[int] | None,
    draft_row: np.ndarray | None = None,
) -> tuple[int, bool]:
    """One position: returns (emitted token, whether it is the accepted proposal)."""
    if params.greedy:
        token = greedy_token(row, banned)
        return token, proposal is not None and token == proposal
    assert rng is not None
    probs = target_probs(row, params, banned)
    if proposal is not None and draft_row is not None:
        return _judge_sampled_draft(probs, target_probs(draft_row, params), proposal, rng)
    token = draw(probs, rng)
    return token, token == proposal


def _judge_sampled_draft(p: np.ndarray, q: np.ndarray, proposal: int, rng: np.random.Generator) -> tuple[int, bool]:
    """Speculative sampling for d ~ q: accept with min(1, p(d)/q(d)), else draw from norm(max(0, p - q))."""
    if q[proposal] <= 0.0:
        raise ValueError(f"draft token {proposal} has probability 0 under the draft distribution it came from")
    if rng.random() < min(1.0, p[proposal] / q[proposal]):
        return proposal, True
    residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:  # p == q accepts surely; guards float rounding only
        return proposal, True
    return draw(residual, rng), False
