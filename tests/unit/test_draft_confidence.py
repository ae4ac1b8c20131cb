"""minions.engines.draft_confidence: lookup drafts' confidence learnt from their outcomes, and the
lookup engines' drafts cut by it."""

from __future__ import annotations

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest
from minions.engines.draft_confidence import DraftConfidence, Evidence, confident_prefix, token_log_probs
from minions.engines.ngram_engine import NgramEngine
from minions.engines.suffix_engine import SuffixEngine

SHORT = Evidence("own", 2)
MARGIN = 3


def settled(confidence: DraftConfidence, start: list[int], draft: list[int], text: list[int],
            request: str = "r") -> None:
    """A draft made after `start`, then the request's sequence `start + text` (plus a speculative tail)."""
    confidence.record(request, start, draft, SHORT)
    confidence.settle(request, start + text + [0] * MARGIN)


def test_before_any_outcome_the_match_length_sets_the_chances():
    confidence = DraftConfidence(MARGIN)
    assert confidence.survival(Evidence("own", 2), 3) == pytest.approx([0.5, 0.25, 0.125])
    assert confidence.survival(Evidence("own", 8), 1) == pytest.approx([0.8])


def test_outcomes_move_the_chances_position_by_position():
    confidence = DraftConfidence(MARGIN, prior_weight=2.0)
    for i in range(8):  # right twice, then wrong: the third position fails every time
        settled(confidence, [1, 2], [7, 8, 9, 10], [7, 8, 5, 6], request=f"r{i}")
    first, second, third = confidence.survival(SHORT, 3)
    assert first == pytest.approx((8 + 1) / (8 + 2)) and second == pytest.approx(first ** 2)
    assert third == pytest.approx(second * 1 / (8 + 2)), "8 tries of the third position, none right"
    assert confidence.survival(SHORT, 4)[3] < third, "the fourth position was never tried: its prior is kept"
    assert confidence.survival(Evidence("corpus", 2), 1) == pytest.approx([0.5]), "another source counts apart"


def test_the_last_tokens_of_a_sequence_are_not_taken_for_its_text():
    """An early draft continues the sequence with a draft still being verified: those tokens may go."""
    confidence = DraftConfidence(MARGIN)
    confidence.record("r", [1, 2], [7, 8], SHORT)
    confidence.settle("r", [1, 2, 7, 8, 9])  # 7, 8 and 9 are within the margin
    assert confidence.trials == {}
    confidence.settle("r", [1, 2, 7, 5, 0, 0, 0])  # verified otherwise: 7 right, then 5
    assert confidence.trials[SHORT.bucket][:3].tolist() == [1, 1, 0]
    assert confidence.hits[SHORT.bucket][:2].tolist() == [1, 0]


def test_a_draft_contradicted_before_its_end_is_counted_at_once():
    confidence = DraftConfidence(MARGIN)
    confidence.record("r", [1], [4, 5, 6, 7, 8], SHORT)
    confidence.settle("r", [1, 4, 9] + [0] * MARGIN)
    assert confidence.trials[SHORT.bucket][:3].tolist() == [1, 1, 0]


def test_a_long_draft_counts_each_position_once_the_text_shows_it():
    """Known positions count at once, before the draft's end shows: a right draft is counted as soon
    as a wrong one would be, and what a request that ends first showed of it is kept."""
    confidence = DraftConfidence(MARGIN)
    confidence.record("r", [1], [4, 5, 6, 7, 8], SHORT)
    confidence.settle("r", [1, 4, 5] + [0] * MARGIN)
    assert confidence.trials[SHORT.bucket][:3].tolist() == [1, 1, 0]
    assert confidence.hits[SHORT.bucket][:3].tolist() == [1, 1, 0]
    confidence.settle("r", [1, 4, 5, 6, 9] + [0] * MARGIN)  # the rest: 6 right, then 9 for 7
    assert confidence.trials[SHORT.bucket][:5].tolist() == [1, 1, 1, 1, 0], "each position counted once"
    assert confidence.hits[SHORT.bucket][:5].tolist() == [1, 1, 1, 0, 0]
    confidence.forget("r")
    assert confidence.trials[SHORT.bucket][:5].tolist() == [1, 1, 1, 1, 0], "kept when the request ends"


def test_a_forgotten_request_counts_nothing_more():
    confidence = DraftConfidence(MARGIN)
    confidence.record("r", [1], [4, 5], SHORT)
    confidence.forget("r")
    confidence.settle("r", [1, 4, 5] + [0] * MARGIN)
    assert confidence.trials == {}


def test_a_draft_made_after_a_rejected_draft_is_not_scored():
    """An early draft continued the sequence with 30, 31 (a draft being verified); the LLM made 40
    instead, so what follows 30, 31 says nothing of the early draft."""
    confidence = DraftConfidence(MARGIN)
    confidence.record("r", [1, 2, 30, 31], [32, 33], SHORT)
    confidence.settle("r", [1, 2, 40, 32, 33, 0, 0, 0])
    assert confidence.trials == {}
    confidence.record("r", [1, 2, 40], [32, 9], SHORT)  # made on what the LLM kept: scored
    confidence.settle("r", [1, 2, 40, 32, 33, 0, 0, 0])
    assert confidence.trials[SHORT.bucket][:2].tolist() == [1, 1]


def test_confident_prefix():
    assert confident_prefix([0.9, 0.5, 0.2], 0.25) == 2
    assert confident_prefix([0.2], 0.25) == 0
    assert confident_prefix([0.9, 0.5], 0.0) == 2


def test_token_log_probs_sum_to_the_log_survival():
    survival = [0.8, 0.4, 0.1]
    assert np.exp(np.cumsum(token_log_probs(survival))) == pytest.approx(survival)
    assert token_log_probs([]) == []


PROMPT = [1, 5, 6, 7, 8, 9, 2, 5, 6]
"""(5, 6) matches once, preceded by 1 and then by 2: a 2-token match, whose prompt lookup drafts 7, 8, 9, 2."""


def ngram_draft(engine: NgramEngine, request_id: str, tokens: list[int]) -> list[int]:
    return engine.generate(EngineRequest(request_id, list(tokens), 8)).tokens


def test_prompt_lookup_drafts_what_its_kind_of_match_has_shown_right():
    """Each request asks once after the prompt, then once more when its text is known; the drafts are
    cut by the prior at first and drafted whole once such drafts proved right, and are learnt from
    whole even while cut."""
    engine = NgramEngine(3, 2, spec_factor=2.0, min_confidence=0.3, settle_margin=MARGIN)
    assert ngram_draft(engine, "r0", PROMPT) == [7], "prior 0.5 a token: 0.25 < 0.3 at the second"
    for i in range(12):
        ngram_draft(engine, f"r{i}", PROMPT)
        ngram_draft(engine, f"r{i}", PROMPT + [7, 8, 9, 2] + [3] * MARGIN)
        engine.release(f"r{i}")
    assert ngram_draft(engine, "later", PROMPT) == [7, 8, 9, 2]


def test_prompt_lookup_stops_drafting_what_its_kind_of_match_has_shown_wrong():
    engine = NgramEngine(3, 2, spec_factor=2.0, min_confidence=0.3, settle_margin=MARGIN)
    for i in range(4):
        ngram_draft(engine, f"r{i}", PROMPT)
        ngram_draft(engine, f"r{i}", PROMPT + [4] * (4 + MARGIN))
        engine.release(f"r{i}")
    assert ngram_draft(engine, "later", PROMPT) == []


def test_suffix_drafts_from_the_corpus_stop_where_they_proved_wrong_and_own_matches_go_on():
    engine = SuffixEngine(max_match=8, min_match=2, min_prob=0.1, corpus_tokens=1000, max_sequences=8,
                          spec_factor=2.0, min_confidence=0.3, settle_margin=MARGIN)
    engine.generate(EngineRequest("earlier", [30, 40, 50, 60, 70, 80], 1))
    engine.release("earlier")  # the corpus: after (30, 40) came 50, 60, 70, 80
    assert engine.generate(EngineRequest("first", [99, 30, 40], 4)).tokens == [50], "the prior: 0.5 a token"
    for i in range(4):  # requests that end in (30, 40) and go on otherwise (kept out of the corpus)
        engine.generate(EngineRequest(f"r{i}", [100 + i, 30, 40], 4))
        engine.generate(EngineRequest(f"r{i}", [100 + i, 30, 40] + [4] * (4 + MARGIN), 4))
    assert engine.generate(EngineRequest("later", [99, 30, 40], 4)).tokens == [], "the corpus's 2-token matches"
    own = [*range(11, 21), 30, 40, *range(11, 19)]
    assert engine.generate(EngineRequest("copying", own, 4)).tokens == [19, 20, 30, 40], "an 8-token match, own"


def test_lookup_drafts_carry_their_chances_as_log_probs_when_asked():
    """What the vote weighs drafts by: each token's learnt chance of being right (the prior here: a
    2-token match, 0.5 a token), only when asked, and over the tokens sent."""
    engine = NgramEngine(3, 2, spec_factor=2.0, settle_margin=MARGIN)
    asked = engine.generate(EngineRequest("r", PROMPT, 3, return_log_probs=True))
    assert asked.tokens == [7, 8, 9]
    assert np.exp(np.cumsum(asked.log_probs)) == pytest.approx([0.5, 0.25, 0.125])
    assert engine.generate(EngineRequest("s", PROMPT, 3)).log_probs is None
    assert engine.generate(EngineRequest("t", [1, 2, 3], 3, return_log_probs=True)).log_probs == [], "no draft"

    suffix = SuffixEngine(max_match=8, min_match=2, min_prob=0.1, corpus_tokens=1000, max_sequences=8,
                          spec_factor=2.0, settle_margin=MARGIN)
    suffix.generate(EngineRequest("earlier", [30, 40, 50, 60, 30, 40, 50, 70], 1))
    suffix.release("earlier")  # the corpus: (30, 40) went on with 50 twice, then 60 once and 70 once
    found = suffix.generate(EngineRequest("r", [99, 30, 40], 3, return_log_probs=True))
    assert found.tokens == [50, 70]
    assert np.exp(np.cumsum(found.log_probs)) == pytest.approx([0.5, 0.5 * 0.5 * 0.5]), \
        "the prior times the matches' shares: 50 in both, then 70 in one of two"
