"""minions.decoding.verification: the accept/resample rule that makes speculative decoding lossless.

The first half checks hand-built logits with exact expected outcomes. The second half checks the claim
that matters: with sampling, text decoded through draft verification has exactly the distribution of
plain sampling from the LLM. It compares the empirical law of 2-token continuations of a tiny random
Llama with the exact law p(t1) * p(t2 | t1) by a chi-square test, and shows the same test rejects two
plausible but wrong verification rules.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from laws import goodness_of_fit
from minions.decoding.engine_call import EngineRequest
from minions.decoding.penalties import NO_PENALTIES, Penalties
from minions.decoding.sampling import GREEDY, SamplingParams, SeededDraws, draw, pick_token, target_probs
from minions.decoding.tokens import common_prefix_len
from minions.decoding.verification import Verdict, verify_draft
from minions.engines.torch_engine import TorchEngine
from minions.text.bad_words import BadWords
from tiny_models import VOCAB, full_logits


def one_hot_rows(argmaxes: list[int], vocab: int = 8) -> np.ndarray:
    """Logit rows whose argmax is the given token, runner-up one below it (cyclically) at a clear gap."""
    rows = np.zeros((len(argmaxes), vocab))
    for i, t in enumerate(argmaxes):
        rows[i, t] = 5.0
        rows[i, (t - 1) % vocab] = 3.0
    return rows


# -- greedy: exact outcomes ------------------------------------------------------------------------


def test_greedy_perfect_match_gets_bonus_token():
    v = verify_draft(one_hot_rows([3, 1, 4]), [3, 1], GREEDY)
    assert v == Verdict([3, 1, 4], 2)


def test_greedy_mismatch_at_first_position_returns_argmax_only():
    v = verify_draft(one_hot_rows([5, 1, 4]), [3, 1], GREEDY)
    assert v == Verdict([5], 0)


def test_greedy_mismatch_later_keeps_accepted_prefix_then_correction():
    v = verify_draft(one_hot_rows([3, 6, 2, 4]), [3, 1, 2], GREEDY)
    assert v == Verdict([3, 6], 1), "nothing after the first rejection may be accepted, even a match"


def test_empty_draft_is_one_plain_step():
    assert verify_draft(one_hot_rows([6]), [], GREEDY) == Verdict([6], 0)
    probs = target_probs(one_hot_rows([6])[0], SamplingParams(temperature=1.0))
    v = verify_draft(one_hot_rows([6]), [], SamplingParams(temperature=1.0), np.random.default_rng(3))
    assert v.num_accepted == 0 and len(v.tokens) == 1 and probs[v.tokens[0]] > 0


def test_end_id_inside_accepted_draft_truncates():
    v = verify_draft(one_hot_rows([3, 7, 1, 2]), [3, 7, 1], GREEDY, end_id=7)
    assert v == Verdict([3, 7], 2)


def test_end_id_as_correction_token_ends_the_verdict():
    v = verify_draft(one_hot_rows([3, 7, 1]), [3, 2], GREEDY, end_id=7)
    assert v == Verdict([3, 7], 1)


def test_end_id_as_bonus_token():
    v = verify_draft(one_hot_rows([3, 2, 7]), [3, 2], GREEDY, end_id=7)
    assert v == Verdict([3, 2, 7], 2)


def test_wrong_row_count_raises():
    with pytest.raises(ValueError, match="need 3 logit rows"):
        verify_draft(one_hot_rows([1, 2]), [1, 2], GREEDY)
    with pytest.raises(ValueError, match="need 1 logit rows"):
        verify_draft(one_hot_rows([1, 2]), [], GREEDY)


def test_sampling_without_rng_raises():
    with pytest.raises(ValueError, match="random generator"):
        verify_draft(one_hot_rows([1, 2]), [1], SamplingParams(temperature=1.0))


# -- bad words during verification -------------------------------------------------------------------


def test_single_token_bad_word_rejects_draft_equal_to_argmax():
    """The draft proposes the LLM's argmax, but it is banned: the verdict must be the runner-up."""
    v = verify_draft(one_hot_rows([3, 1]), [3], GREEDY, bad_words=BadWords([[3]]))
    assert v == Verdict([2], 0)


def test_multi_token_bad_word_completed_by_context_and_draft():
    """[5, 3] is banned: 3 may follow anything but 5. Context ends in 5 here."""
    bad = BadWords([[5, 3]])
    assert verify_draft(one_hot_rows([3, 1]), [3], GREEDY, context=[0, 5], bad_words=bad) == Verdict([2], 0)
    assert verify_draft(one_hot_rows([3, 1]), [3], GREEDY, context=[5, 0], bad_words=bad) == Verdict([3, 1], 1)


def test_multi_token_bad_word_spanning_draft_tokens():
    """[4, 6, 1] is banned; context gives 4, the accepted draft 6, so 1 is banned at position 1."""
    bad = BadWords([[4, 6, 1]])
    v = verify_draft(one_hot_rows([6, 1, 2]), [6, 1], GREEDY, context=[1, 4], bad_words=bad)
    assert v == Verdict([6, 0], 1)


def test_long_bad_word_is_enforced_like_plain_decoding():
    """A 12-token bad word whose first 11 tokens end the context bans its last token, however long the
    word: plain decoding (TorchEngine._generate) checks the whole sequence, so verification must too."""
    word = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 0]
    context = [6, 6] + word[:-1]
    bad = BadWords([word])
    assert 0 in bad.banned_next(context)
    v = verify_draft(one_hot_rows([0, 5]), [0], GREEDY, context=context, bad_words=bad)
    assert v == Verdict([7], 0)


def test_sampling_never_emits_banned_token():
    logits = np.log(np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    params = SamplingParams(temperature=1.0)
    bad = BadWords([[0]])
    rng = np.random.default_rng(0)
    for _ in range(300):
        v = verify_draft(logits, [0], params, rng, bad_words=bad)
        assert v.num_accepted == 0 and v.tokens[0] in (1, 2)


# -- sampling: exact edge outcomes -------------------------------------------------------------------


def test_sampling_draft_with_probability_one_is_always_accepted():
    logits = one_hot_rows([3, 1])
    params = SamplingParams(temperature=1.0, top_p=0.5)  # the nucleus is the argmax alone
    rng = np.random.default_rng(0)
    for _ in range(50):
        v = verify_draft(logits, [3], params, rng)
        assert v.tokens[:1] == [3] and v.num_accepted == 1


def test_sampling_draft_outside_support_is_always_rejected_and_never_emitted():
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    params = SamplingParams(temperature=1.0, top_k=2)  # p(2) = p(3) = 0
    rng = np.random.default_rng(0)
    firsts = Counter()
    for _ in range(400):
        v = verify_draft(logits, [2], params, rng)
        assert v.num_accepted == 0 and len(v.tokens) == 1
        firsts[v.tokens[0]] += 1
    assert set(firsts) == {0, 1}


def test_rejected_sampled_draft_is_never_the_correction():
    """On rejection the draft token is removed from p before resampling."""
    logits = np.log(np.array([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]]))
    params = SamplingParams(temperature=1.0)
    rng = np.random.default_rng(5)
    outcomes = Counter()
    for _ in range(2000):
        v = verify_draft(logits, [0], params, rng)
        if v.num_accepted == 0:
            assert v.tokens != [0]
        outcomes[v.num_accepted] += 1
    # p(accept) = p(0) = 0.5, within 5 standard deviations
    assert abs(outcomes[1] / 2000 - 0.5) < 5 * np.sqrt(0.25 / 2000)


# -- statistical losslessness on a real (tiny) model -------------------------------------------------

PROMPT = [3, 7, 1, 9, 4]
N_SAMPLES = 4000
SETTINGS = {
    "T0.8-top_p0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "T1.2-top_k5": SamplingParams(temperature=1.2, top_k=5),
}


class NextLogits:
    """The LLM's next-token logits per context, each computed once from scratch and cached."""

    def __init__(self, model) -> None:
        self.model = model
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, tokens) -> np.ndarray:
        key = tuple(int(t) for t in tokens)
        if key not in self._rows:
            self._rows[key] = full_logits(self.model, list(key))[-1]
        return self._rows[key]

    def rows(self, context: list[int], draft: list[int]) -> np.ndarray:
        """The [len(draft) + 1, vocab] block an engine hands to verify_draft."""
        return np.stack([self(context + draft[:i]) for i in range(len(draft) + 1)])


PENALTIES = Penalties(repetition=2.0, presence=1.5, frequency=1.0, prompt_length=len(PROMPT))
"""Penalties that move the law: the prompt's tokens and t1 are penalised when t2 is drawn."""


def exact_two_token_law(next_logits: NextLogits, params: SamplingParams, penalties: Penalties = NO_PENALTIES
                        ) -> np.ndarray:
    """P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1) as a flat [VOCAB * VOCAB] vector, each p as plain
    decoding with `penalties` makes it."""
    def p(context: list[int]) -> np.ndarray:
        return target_probs(penalties.apply(next_logits(context), context, None), params)

    p1 = p(PROMPT)
    law = np.zeros((VOCAB, VOCAB))
    for t1 in np.flatnonzero(p1):
        law[t1] = p1[t1] * p(PROMPT + [int(t1)])
    assert law.sum() == pytest.approx(1.0)
    return law.reshape(-1)


def sample_two_tokens(next_logits: NextLogits, verifier, draft: list[int], params, rng,
                      penalties: Penalties | None = None) -> int:
    """One 2-token continuation as the decode loop makes it: verify `draft`, keep at most the 2 first
    tokens, then (after an early rejection) one plain step; returns the flat index t1 * VOCAB + t2.
    `penalties` go to the verifier with each call's context (for verifiers that take them)."""
    def verify(context: list[int], proposal: list[int]):
        extra = {} if penalties is None else {"context": context, "penalties": penalties}
        return verifier(next_logits.rows(context, proposal), proposal, params, rng, **extra).tokens

    out = verify(PROMPT, draft)[:2]
    if len(out) < 2:
        out += verify(PROMPT + out, [])
    return out[0] * VOCAB + out[1]


def run_sampler(next_logits, verifier, draft, params, seed: int, penalties: Penalties | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    outcomes = [sample_two_tokens(next_logits, verifier, draft, params, rng, penalties) for _ in range(N_SAMPLES)]
    return np.bincount(outcomes, minlength=VOCAB * VOCAB)


def rule(name: str, accept, resample):
    """A verifier made of an acceptance probability accept(p, q, d, row) and a resampling vector
    resample(p, q, d); q is None for a deterministic draft. Used to build deliberately wrong rules."""

    def verify(logits, draft, params, rng, draft_logits=None) -> Verdict:
        tokens = []
        for i, row in enumerate(logits):
            p = target_probs(row, params)
            if i == len(draft):
                return Verdict(tokens + [draw(p, rng)], len(draft))
            q = target_probs(draft_logits[i], params) if draft_logits is not None else None
            d = int(draft[i])
            if rng.random() < accept(p, q, d, row):
                tokens.append(d)
                continue
            return Verdict(tokens + [draw(resample(p, q, d), rng)], i)
        raise AssertionError("unreachable")

    verify.__name__ = name
    return verify


def without(p: np.ndarray, d: int) -> np.ndarray:
    out = p.copy()
    out[d] = 0.0
    return out


# Wrong: accept d with probability p(d), but on rejection draw from p itself (d not removed).
wrong_verify_no_residual = rule("wrong_verify_no_residual", lambda p, q, d, row: p[d], lambda p, q, d: p)
# Wrong: accept d with its raw softmax probability (no temperature, top-k, top-p), resample correctly.
wrong_verify_raw_softmax_acceptance = rule(
    "wrong_verify_raw_softmax_acceptance",
    lambda p, q, d, row: target_probs(row, SamplingParams(temperature=1.0))[d],
    lambda p, q, d: without(p, d),
)


def wrong_verify_always_accept(logits, draft, params, rng) -> Verdict:
    """Wrong: trust the draft blindly and only sample the bonus token."""
    return Verdict([int(t) for t in draft] + [draw(target_probs(logits[-1], params), rng)], len(draft))


@pytest.fixture(scope="module")
def next_logits(tiny_llm) -> NextLogits:
    return NextLogits(tiny_llm)


def named_drafts(next_logits: NextLogits, params: SamplingParams) -> dict[str, list[int]]:
    """Deterministic drafts derived from the model itself (never hard-coded token ids)."""
    p1 = target_probs(next_logits(PROMPT), params)
    order1 = [int(t) for t in np.argsort(-p1, kind="stable")]
    greedy1 = order1[0]
    greedy2 = int(np.argmax(next_logits(PROMPT + [greedy1])))
    second1 = order1[1]
    p2 = target_probs(next_logits(PROMPT + [second1]), params)
    third2 = int(np.argsort(-p2, kind="stable")[2])
    outside = int(np.argmin(p1))
    assert p1[outside] == 0.0, "the setting must truncate some tokens for the 'outside' draft"
    return {
        "greedy": [greedy1, greedy2],
        "non-greedy": [second1, third2],
        "outside-support": [outside, greedy1],
    }


@pytest.mark.parametrize("setting", SETTINGS)
def test_verification_preserves_the_llm_distribution(next_logits, setting):
    """Speculative sampling must be lossless: chi-square p-value > 0.001 for every draft."""
    params = SETTINGS[setting]
    law = exact_two_token_law(next_logits, params)
    assert np.count_nonzero(law * N_SAMPLES >= 5) >= 10, "the law must be spread out enough to test"
    drafts = named_drafts(next_logits, params)
    for i, (name, draft) in enumerate(drafts.items()):
        counts = run_sampler(next_logits, verify_draft, draft, params, seed=100 + i)
        pvalue = goodness_of_fit(counts, law)
        assert pvalue > 1e-3, f"draft {name} {draft}: p-value {pvalue:.3g}"


@pytest.mark.parametrize("setting", SETTINGS)
def test_verification_with_penalties_preserves_the_penalised_distribution(next_logits, setting):
    """Penalties keep sampling lossless: the verifier applies them to each row as plain decoding would
    at that position (the draft is judged against the penalised law), and the test tells the penalised
    law from the plain one (a verifier that ignores the penalties is rejected)."""
    params = SETTINGS[setting]
    law = exact_two_token_law(next_logits, params, PENALTIES)
    plain_law = exact_two_token_law(next_logits, params)
    drafts = named_drafts(next_logits, params)
    for i, (name, draft) in enumerate(drafts.items()):
        counts = run_sampler(next_logits, verify_draft, draft, params, seed=300 + i, penalties=PENALTIES)
        pvalue = goodness_of_fit(counts, law)
        assert pvalue > 1e-3, f"draft {name} {draft}: p-value {pvalue:.3g}"
    ignoring = run_sampler(next_logits, verify_draft, drafts["greedy"], params, seed=400)
    assert goodness_of_fit(ignoring, law) < 1e-6 and goodness_of_fit(ignoring, plain_law) > 1e-3


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize(
    ("wrong", "draft_names"),
    [
        pytest.param(wrong_verify_no_residual, ("greedy", "non-greedy"), id="no-residual"),
        pytest.param(wrong_verify_always_accept, ("greedy", "non-greedy", "outside-support"), id="always-accept"),
        # raw and adjusted p are close for the runner-up token, so only the greedy draft separates them
        pytest.param(wrong_verify_raw_softmax_acceptance, ("greedy",), id="raw-softmax-acceptance"),
    ],
)
def test_goodness_of_fit_detects_wrong_verification_rules(next_logits, setting, wrong, draft_names):
    """The losslessness test has power: the same statistic rejects wrong rules with p < 1e-6."""
    params = SETTINGS[setting]
    law = exact_two_token_law(next_logits, params)
    drafts = named_drafts(next_logits, params)
    for i, name in enumerate(draft_names):
        counts = run_sampler(next_logits, wrong, drafts[name], params, seed=200 + i)
        pvalue = goodness_of_fit(counts, law)
        assert pvalue < 1e-6, f"{wrong.__name__} on draft {name} went undetected (p-value {pvalue:.3g})"


def test_a_seeded_verification_emits_the_tokens_plain_decoding_draws_whatever_the_draft():
    """A seeded request's draw at a position is fixed (SeededDraws), and a draft token is judged by that
    very draw: whatever was drafted, the emitted tokens are those plain decoding emits from the same
    rows, so a request that comes again with its seed repeats itself though its drafts differ."""
    params = SamplingParams(temperature=1.0)
    rows = np.random.default_rng(4).normal(scale=1.5, size=(5, 8))
    context = [1, 2, 3]
    for seed in range(40):
        draws = SeededDraws(seed)
        plain = [pick_token(row, params, draws.at(len(context) + i)) for i, row in enumerate(rows)]
        drafts = [plain[:4], plain[:2] + [(plain[2] + 1) % 8, plain[3]], [(plain[0] + 1) % 8] * 4,
                  [int(t) for t in np.random.default_rng(seed).integers(0, 8, 4)]]
        for draft in drafts:
            verdict = verify_draft(rows, draft, params, draws, context)
            assert verdict.tokens == plain[:len(verdict.tokens)], (seed, draft)
            assert verdict.num_accepted == common_prefix_len(draft, plain)
        assert verify_draft(rows, plain[:4], params, draws, context).tokens == plain


def test_torch_engine_verification_is_verify_draft_on_the_model_logits(tiny_llm):
    """The engine path: TorchEngine.generate with a draft equals verify_draft on from-scratch logits with
    the request's seed, and repeats exactly for a repeated seed."""
    params = SETTINGS["T0.8-top_p0.9"]
    engine = TorchEngine(tiny_llm, max_sequences=2)
    next_logits = NextLogits(tiny_llm)
    draft = named_drafts(next_logits, params)["non-greedy"]
    rows = full_logits(tiny_llm, PROMPT + draft)[-len(draft) - 1:]
    accepted = Counter()
    for seed in range(60):
        request = EngineRequest("r", PROMPT, len(draft) + 1, draft=draft, sampling=params, seed=seed)
        got = engine.generate(request)
        want = verify_draft(rows, draft, params, SeededDraws(seed), PROMPT)
        got_accepted = common_prefix_len(got.tokens, draft)  # a recovered token never equals the draft's
        assert (got.tokens, got_accepted) == (want.tokens, want.num_accepted), f"seed {seed}"
        again = engine.generate(request)
        assert again.tokens == got.tokens
        accepted[got_accepted] += 1
    assert len(accepted) >= 2, "the draft should be sometimes accepted and sometimes rejected"


def test_torch_engine_first_token_marginal_matches_p(tiny_llm):
    """400 seeded engine calls with a non-greedy draft: the first emitted token has law p(. | prompt)."""
    params = SETTINGS["T1.2-top_k5"]
    engine = TorchEngine(tiny_llm, max_sequences=2)
    next_logits = NextLogits(tiny_llm)
    draft = named_drafts(next_logits, params)["non-greedy"][:1]
    p1 = target_probs(next_logits(PROMPT), params)
    firsts = [
        engine.generate(EngineRequest("r", PROMPT, 2, draft=draft, sampling=params, seed=seed)).tokens[0]
        for seed in range(400)
    ]
    assert goodness_of_fit(np.bincount(firsts, minlength=VOCAB), p1) > 1e-3


# -- sampled drafts (draft_logits): accept with min(1, p/q), resample from norm(max(0, p - q)) ---------

def sample_two_tokens_with_sampled_draft(target: NextLogits, drafter: NextLogits, verifier, params, rng) -> int:
    """The SSM samples a 2-token draft from its own q and sends its logits; then as sample_two_tokens."""
    draft, rows = [], []
    for _ in range(2):
        row = drafter(PROMPT + draft)
        rows.append(row)
        draft.append(draw(target_probs(row, params), rng))
    out = verifier(target.rows(PROMPT, draft), draft, params, rng, np.stack(rows)).tokens[:2]
    if len(out) < 2:
        out += verifier(target.rows(PROMPT + out, []), [], params, rng, None).tokens
    return out[0] * VOCAB + out[1]


def correct_rule(logits, draft, params, rng, draft_logits):
    return verify_draft(logits, draft, params, rng, draft_logits=draft_logits)


# Wrong: accept with min(1, p/q) but on rejection draw from p instead of norm(max(0, p - q)).
wrong_rule_resample_from_p = rule(
    "wrong_rule_resample_from_p", lambda p, q, d, row: min(1.0, p[d] / q[d]), lambda p, q, d: p
)
# Wrong: accept with min(1, q/p) instead of min(1, p/q); the residual is right. (Judging a sampled
# draft as deterministic, accept with p(d), is NOT wrong: it keeps p exactly for any draft
# distribution and only accepts less often; see the test below.)
wrong_rule_inverted_ratio = rule(
    "wrong_rule_inverted_ratio",
    lambda p, q, d, row: min(1.0, q[d] / p[d]) if p[d] > 0 else 0.0,
    lambda p, q, d: np.maximum(p - q, 0.0),
)


@pytest.fixture(scope="module")
def ssm_logits(tiny_ssm) -> NextLogits:
    return NextLogits(tiny_ssm)


def run_sampled_draft(next_logits, ssm_logits, rule, params, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    outcomes = [sample_two_tokens_with_sampled_draft(next_logits, ssm_logits, rule, params, rng) for _ in range(N_SAMPLES)]
    return np.bincount(outcomes, minlength=VOCAB * VOCAB)


@pytest.mark.parametrize("setting", SETTINGS)
def test_sampled_draft_verification_preserves_the_llm_distribution(next_logits, ssm_logits, setting):
    params = SETTINGS[setting]
    counts = run_sampled_draft(next_logits, ssm_logits, correct_rule, params, seed=11)
    assert goodness_of_fit(counts, exact_two_token_law(next_logits, params)) > 1e-3


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("wrong", [wrong_rule_resample_from_p, wrong_rule_inverted_ratio])
def test_goodness_of_fit_detects_wrong_sampled_draft_rules(next_logits, ssm_logits, setting, wrong):
    params = SETTINGS[setting]
    counts = run_sampled_draft(next_logits, ssm_logits, wrong, params, seed=11)
    assert goodness_of_fit(counts, exact_two_token_law(next_logits, params)) < 1e-6


def test_sampled_draft_judged_as_deterministic_still_keeps_p(next_logits, ssm_logits):
    """SSMs without logits (n-gram) fall back to the deterministic rule even for sampled drafts: exact."""
    params = SETTINGS["T0.8-top_p0.9"]
    ignore = lambda logits, draft, params, rng, draft_logits: verify_draft(logits, draft, params, rng)  # noqa: E731
    counts = run_sampled_draft(next_logits, ssm_logits, ignore, params, seed=12)
    assert goodness_of_fit(counts, exact_two_token_law(next_logits, params)) > 1e-3


def test_sampled_draft_accepts_more_often_than_judging_it_deterministic(next_logits, ssm_logits):
    """Why draft logits are worth sending: with q close to p, min(1, p/q) accepts more than p(d)."""
    params = SETTINGS["T0.8-top_p0.9"]
    rng = np.random.default_rng(3)
    accepted = {"with logits": 0, "as deterministic": 0}
    for _ in range(2000):
        row = ssm_logits(PROMPT)
        d = draw(target_probs(row, params), rng)
        rows = next_logits.rows(PROMPT, [d])
        accepted["with logits"] += verify_draft(rows, [d], params, rng, draft_logits=row[None]).num_accepted
        accepted["as deterministic"] += verify_draft(rows, [d], params, rng).num_accepted
    assert accepted["with logits"] > accepted["as deterministic"]


def test_draft_logits_of_the_wrong_shape_are_rejected(next_logits):
    rows = next_logits.rows(PROMPT, [1, 2])
    with pytest.raises(ValueError, match="draft_logits"):
        verify_draft(rows, [1, 2], SETTINGS["T0.8-top_p0.9"], np.random.default_rng(0),
                     draft_logits=np.zeros((1, VOCAB)))
