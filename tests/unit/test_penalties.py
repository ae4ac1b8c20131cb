"""minions.decoding.penalties: what each penalty does to a row of logits, and that verification with
penalties decides exactly as plain decoding with them (greedy here; the sampled law in test_verification)."""

from __future__ import annotations

import numpy as np
import pytest

from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import GREEDY
from minions.decoding.verification import verify_draft

LOGITS = np.array([2.0, -1.0, 0.5, 3.0, 1.0])


def test_neutral_penalties_return_the_logits_themselves():
    assert NO_PENALTIES.apply(LOGITS, [0, 3, 3], end_id=4) is LOGITS
    assert Penalties(prompt_length=2).neutral


def test_repetition_divides_positive_and_multiplies_negative_logits_of_prompt_and_output_tokens():
    out = Penalties(repetition=2.0, prompt_length=2).apply(LOGITS, [0, 1, 3], end_id=None)
    np.testing.assert_allclose(out, [1.0, -2.0, 0.5, 1.5, 1.0])  # 0, 1 in the prompt; 3 in the output


def test_presence_and_frequency_count_output_tokens_only():
    out = Penalties(presence=0.5, frequency=0.25, prompt_length=2).apply(LOGITS, [3, 2, 3, 3, 0], end_id=None)
    # output [3, 3, 0]: token 3 twice, token 0 once; token 2 only in the prompt
    np.testing.assert_allclose(out, [2.0 - 0.75, -1.0, 0.5, 3.0 - 1.0, 1.0])


def test_min_tokens_bans_end_id_until_the_output_is_long_enough():
    rule = Penalties(min_tokens=2, prompt_length=1)
    assert rule.apply(LOGITS, [0, 2], end_id=3)[3] == -np.inf
    assert rule.apply(LOGITS, [0, 2, 2], end_id=3)[3] == 3.0
    assert rule.apply(LOGITS, [0], end_id=None)[3] == 3.0  # no end_id: nothing to ban


def _plain(rows_for, context: list[int], n: int, penalties: Penalties, end_id: int | None) -> list[int]:
    sequence, out = list(context), []
    for _ in range(n):
        token = int(np.argmax(penalties.apply(rows_for(sequence), sequence, end_id)))
        out.append(token)
        sequence.append(token)
        if token == end_id:
            break
    return out


@pytest.mark.parametrize("penalties, end_bias", [(Penalties(repetition=3.0, prompt_length=3), 0.0),
                                                 (Penalties(presence=0.8, frequency=0.6, prompt_length=3), 0.0),
                                                 (Penalties(min_tokens=4, prompt_length=3), 1.5)])
def test_greedy_verification_with_penalties_is_plain_decoding_with_them(penalties, end_bias):
    """Any draft, accepted or not, yields a prefix of what plain greedy decoding with the same penalties
    makes, position for position (each row sees the sequence up to its own position)."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(64, 6))
    table[:, 5] += end_bias  # for min_tokens: end_id is often the unpenalized argmax

    def rows_for(sequence):
        return table[hash(tuple(sequence)) % 64]

    context, end_id = [1, 2, 1], (5 if penalties.min_tokens else None)
    want = _plain(rows_for, context, 6, penalties, end_id)
    assert want != _plain(rows_for, context, 6, NO_PENALTIES, end_id), "the penalties must change the output"
    for draft in (want[:4], want[:2] + [(want[2] + 1) % 6, 0], [0, 0, 0, 0]):
        rows = np.stack([rows_for(context + draft[:i]) for i in range(len(draft) + 1)])
        verdict = verify_draft(rows, draft, GREEDY, context=context, end_id=end_id, penalties=penalties)
        assert verdict.tokens == want[: len(verdict.tokens)], (draft, verdict)
