"""minions.decoding.sampling: the distribution p that plain decoding and verification both draw from."""

from __future__ import annotations

import numpy as np
import pytest

from minions.decoding.sampling import (
    GREEDY,
    SamplingParams,
    SeededDraws,
    derived_seed,
    draw,
    generator_at,
    greedy_token,
    masked_logits,
    pick_token,
    request_randomness,
    target_probs,
)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - np.max(z))
    return e / e.sum()


LOGITS = np.array([1.0, 3.0, -0.5, 2.5, 0.2, 2.9, -2.0, 0.7])


def test_greedy_property():
    assert GREEDY.greedy
    assert SamplingParams(temperature=0.0, top_k=50).greedy
    assert SamplingParams(temperature=0.7, top_k=1).greedy, "top_k 1 is greedy in TensorRT-LLM"
    assert not SamplingParams(temperature=0.7).greedy


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_k=1)])
def test_greedy_probs_are_one_hot_argmax(params):
    probs = target_probs(LOGITS, params)
    expected = np.zeros_like(LOGITS)
    expected[int(np.argmax(LOGITS))] = 1.0
    np.testing.assert_array_equal(probs, expected)


def test_greedy_ties_break_towards_lower_id():
    """Verification and plain decoding must agree on ties; both use the lowest id like torch.argmax."""
    logits = np.array([0.0, 2.0, 1.0, 2.0])
    assert greedy_token(logits) == 1
    assert target_probs(logits, GREEDY)[1] == 1.0


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scaling_matches_softmax(temperature):
    probs = target_probs(LOGITS, SamplingParams(temperature=temperature))
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, softmax(LOGITS / temperature), rtol=1e-12)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k", [2, 3, 5, 7])
def test_top_k_keeps_exactly_k_most_likely(k):
    probs = target_probs(LOGITS, SamplingParams(temperature=0.8, top_k=k))
    top = np.argsort(-LOGITS)[:k]
    assert np.count_nonzero(probs) == k
    assert set(np.flatnonzero(probs)) == set(top.tolist())
    np.testing.assert_allclose(probs[top], softmax(LOGITS[top] / 0.8), rtol=1e-12)


@pytest.mark.parametrize("k", [0, len(LOGITS), len(LOGITS) + 10])
def test_top_k_zero_or_at_least_vocab_is_disabled(k):
    probs = target_probs(LOGITS, SamplingParams(temperature=1.0, top_k=k))
    np.testing.assert_allclose(probs, softmax(LOGITS), rtol=1e-12)


def test_top_p_keeps_smallest_nucleus_including_crossing_token():
    """Mass 0.5, 0.3, 0.15, 0.05: top_p 0.7 needs the first two (0.5 < 0.7 <= 0.8), not one or three."""
    base = np.array([0.15, 0.5, 0.05, 0.3])
    logits = np.log(base)
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    np.testing.assert_allclose(probs, [0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8], rtol=1e-12)


def test_top_p_crossing_into_third_token():
    base = np.array([0.15, 0.5, 0.05, 0.3])
    probs = target_probs(np.log(base), SamplingParams(temperature=1.0, top_p=0.85))
    np.testing.assert_allclose(probs, [0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95], rtol=1e-12)


def test_top_p_reached_exactly_stops_there():
    """Mass 0.5 + 0.25 is exactly 0.75 (binary-exact): that nucleus already reaches top_p 0.75, so the
    third token is not needed. Equal probabilities are ordered by id."""
    probs = target_probs(np.log(np.array([0.25, 0.5, 0.25])), SamplingParams(temperature=1.0, top_p=0.75))
    np.testing.assert_allclose(probs, [1 / 3, 2 / 3, 0.0], rtol=1e-12)


def test_top_p_below_largest_keeps_only_the_argmax():
    base = np.array([0.15, 0.5, 0.05, 0.3])
    probs = target_probs(np.log(base), SamplingParams(temperature=1.0, top_p=0.01))
    np.testing.assert_array_equal(probs, [0.0, 1.0, 0.0, 0.0])


def test_top_p_applies_after_top_k():
    """Probabilities 0.4, 0.15, 0.2, 0.25 with top_k 2, top_p 0.6: top-k first renormalises to 0.62, 0.38,
    so the nucleus is the argmax alone; top-p first would have kept two tokens."""
    logits = np.log(np.array([0.4, 0.15, 0.2, 0.25]))
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.6))
    np.testing.assert_allclose(probs, [1.0, 0.0, 0.0, 0.0])


def test_temperature_applies_before_top_p():
    """Base probabilities 0.5, 0.3, 0.2 with top_p 0.75: at T=1 two tokens are kept; at T=0.25 the argmax
    holds 0.5^4 / (0.5^4 + 0.3^4 + 0.2^4) > 0.75 on its own, so it is kept alone."""
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    assert np.count_nonzero(target_probs(logits, SamplingParams(temperature=1.0, top_p=0.75))) == 2
    np.testing.assert_allclose(target_probs(logits, SamplingParams(temperature=0.25, top_p=0.75)), [1.0, 0.0, 0.0])


@pytest.mark.parametrize(
    "params", [GREEDY, SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3, top_p=0.8)]
)
def test_banned_tokens_get_zero_probability(params):
    banned = [int(np.argmax(LOGITS)), 3]
    probs = target_probs(LOGITS, params, banned)
    assert probs[banned].sum() == 0.0
    assert probs.sum() == pytest.approx(1.0)
    if params.greedy:
        assert probs[5] == 1.0  # the best token that is not banned
    else:
        assert probs[5] > 0.0


def test_masked_logits_copies_only_when_needed():
    assert masked_logits(LOGITS, None) is LOGITS
    assert masked_logits(LOGITS, []) is LOGITS
    out = masked_logits(LOGITS, [1])
    assert out[1] == -np.inf and LOGITS[1] == 3.0, "the caller's logits must not be modified"


def test_draw_frequencies_match_distribution():
    """20000 seeded draws: every count within 5 binomial standard deviations of n * p."""
    probs = np.array([0.05, 0.0, 0.4, 0.25, 0.0, 0.3])
    rng = np.random.default_rng(1234)
    n = 20000
    counts = np.bincount([draw(probs, rng) for _ in range(n)], minlength=len(probs))
    assert counts[1] == 0 and counts[4] == 0, "zero-probability tokens must never be drawn"
    sd = np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(counts - n * probs) <= 5 * sd + 1e-9), counts


def test_draw_accepts_unnormalised_weights():
    weights = np.array([0.0, 2.0, 0.0, 6.0])
    rng = np.random.default_rng(7)
    n = 8000
    counts = np.bincount([draw(weights, rng) for _ in range(n)], minlength=4)
    assert counts[0] == counts[2] == 0
    assert abs(counts[3] / n - 0.75) < 5 * np.sqrt(0.75 * 0.25 / n)


def test_draw_never_picks_zero_mass_token_at_u_zero():
    """u = 0 must land on the first token with positive mass, not on a leading zero-probability token."""

    class ZeroRng:
        def random(self):
            return 0.0

    assert draw(np.array([0.0, 0.0, 1.0, 1.0]), ZeroRng()) == 2


def test_pick_token_greedy_ignores_rng_and_sampling_uses_it():
    rng = np.random.default_rng(0)
    assert pick_token(LOGITS, GREEDY, rng) == 1
    assert pick_token(LOGITS, GREEDY, rng, banned=[1]) == 5
    params = SamplingParams(temperature=1.0, top_k=2)
    seen = {pick_token(LOGITS, params, np.random.default_rng(s)) for s in range(200)}
    assert seen == {1, 5}
    a = [pick_token(LOGITS, params, np.random.default_rng(42)) for _ in range(5)]
    assert len(set(a)) == 1, "the same seed must give the same token"


def test_a_seeded_requests_draw_at_a_position_depends_on_the_seed_and_the_position_only():
    draws = SeededDraws(7)
    first = [generator_at(draws, p).random() for p in range(6)]
    assert [generator_at(draws, p).random() for p in reversed(range(6))] == first[::-1]
    assert len(set(first)) == 6
    assert generator_at(SeededDraws(8), 3).random() != first[3]
    assert isinstance(request_randomness(None), np.random.Generator)
    assert isinstance(request_randomness(7), SeededDraws)


def test_a_derived_seed_is_a_uint64_function_of_the_seed_and_its_keys():
    assert derived_seed(None, 1) is None
    assert derived_seed(1, 5) == derived_seed(1, 5)
    assert len({derived_seed(1, 5), derived_seed(1, 6), derived_seed(2, 5), derived_seed(1, 5, 1)}) == 4
    assert 0 <= derived_seed(2**64 - 1, 10**6) < 2**64
