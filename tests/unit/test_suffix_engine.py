"""minions.engines.suffix_engine: suffix drafting from the request's own context and from released requests."""

from __future__ import annotations

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest
from minions.engines.api import MeteredEngine
from minions.engines.factory import build_engine
from minions.engines.suffix_engine import SuffixEngine, TokenIndex, gram_keys
from minions.errors import InvalidRequest
from minions.settings import EngineSettings


def make(**settings) -> SuffixEngine:
    """Built as a deployment builds it (the defaults are EngineSettings'), its drafts not cut by
    confidence unless `lookup_min_confidence` is given (tested in test_draft_confidence.py)."""
    engine = build_engine(EngineSettings(engine="suffix", **{"lookup_min_confidence": 0.0, **settings}))
    assert isinstance(engine, SuffixEngine)
    return engine


def draft(engine: SuffixEngine, request_id: str, tokens: list[int], k: int = 8, end_id: int | None = None) -> list[int]:
    return engine.generate(EngineRequest(request_id, list(tokens), k, end_id=end_id)).tokens


def finish(engine: SuffixEngine, request_id: str, tokens: list[int]) -> None:
    """A request that saw `tokens` and ended: its sequence joins the corpus."""
    draft(engine, request_id, tokens)
    engine.release(request_id)


def test_drafts_from_its_own_context():
    engine = make()
    assert draft(engine, "a", [5, 1, 2, 3, 4, 9, 9, 1, 2], k=3) == [3, 4, 9]


def test_longest_suffix_wins_over_a_more_recent_shorter_match():
    engine = make()
    tokens = [7, 1, 2, 30, 31, 0, 1, 2, 40, 41, 0, 8, 7, 1, 2]
    assert draft(engine, "a", tokens, k=2) == [30, 31], "[7, 1, 2] matched at the start beats the later [1, 2]"


def test_drafts_from_another_requests_released_sequence():
    engine = make()
    finish(engine, "a", [10, 11, 12, 13, 14, 15])
    assert draft(engine, "b", [99, 11, 12], k=3) == [13, 14, 15]
    assert draft(engine, "c", [99, 14, 15], k=3) == [], "the corpus sequence ends at 15: nothing after it"


def test_a_live_request_is_not_in_the_corpus_until_released():
    engine = make()
    draft(engine, "a", [10, 11, 12, 13])
    assert draft(engine, "b", [11, 12]) == []
    engine.release("a")
    assert draft(engine, "b", [11, 12]) == [13]


def test_most_frequent_continuation_wins_over_the_most_recent():
    engine = make()
    for i, last in enumerate([4, 4, 5]):
        finish(engine, f"r{i}", [1, 2, 3, last, 6])
    assert draft(engine, "q", [9, 2, 3], k=1) == [4], "4 followed [2, 3] twice, 5 once (most recently)"
    assert draft(engine, "q2", [9, 3, 5], k=2) == [6]


def test_ties_in_frequency_go_to_the_most_recent():
    engine = make()
    finish(engine, "a", [1, 2, 3, 4])
    finish(engine, "b", [1, 2, 3, 5])
    assert draft(engine, "q", [8, 2, 3], k=1) == [5]


def test_min_prob_stops_a_draft_the_matches_disagree_on():
    engine = make(suffix_min_prob=0.4)
    for i, last in enumerate([4, 5, 6]):
        finish(engine, f"r{i}", [1, 2, 3, last])
    assert draft(engine, "q", [8, 2, 3]) == [], "each continuation has a share of 1/3 < 0.4"
    finish(engine, "r3", [1, 2, 3, 4])
    assert draft(engine, "q2", [8, 2, 3]) == [4], "4 now has a share of 1/2"


def test_own_context_wins_a_tie_in_match_length():
    engine = make()
    for i in range(3):
        finish(engine, f"r{i}", [1, 2, 3, 50, 51])
    assert draft(engine, "q", [2, 3, 60, 61, 8, 2, 3], k=2) == [60, 61]


def test_a_longer_match_in_the_corpus_beats_a_shorter_own_one():
    engine = make()
    finish(engine, "r", [7, 8, 2, 3, 50, 51])
    assert draft(engine, "q", [2, 3, 60, 61, 8, 2, 3], k=3) == [50, 51], "though the own draft is longer"


def test_no_match_no_draft():
    engine = make()
    finish(engine, "r", [1, 2, 3, 4])
    assert draft(engine, "q", [5, 6, 7, 8, 9]) == []
    assert draft(engine, "q1", [1]) == [], "shorter than suffix_min_match"
    assert draft(make(suffix_min_match=3), "q2", [9, 1, 2, 8, 1, 2]) == [], "a 2-token match is below the minimum"


def test_corpus_budget_evicts_the_oldest_sequences():
    engine = make(suffix_corpus_tokens=12)
    finish(engine, "a", [1, 2, 3, 4, 5])  # 5 tokens + the separator
    finish(engine, "b", [11, 12, 13, 14, 15])
    assert draft(engine, "q", [9, 2, 3], k=1) == [4]
    finish(engine, "c", [21, 22, 23, 24, 25])  # 18 tokens > 12: a goes
    assert draft(engine, "q2", [9, 2, 3], k=1) == []
    assert draft(engine, "q3", [9, 12, 13], k=1) == [14]
    assert draft(engine, "q4", [9, 22, 23], k=1) == [24]


def test_corpus_index_stays_within_the_budget():
    engine = make(suffix_corpus_tokens=300)
    rng = np.random.default_rng(0)
    for i in range(60):
        finish(engine, f"r{i}", rng.integers(0, 20, size=int(rng.integers(2, 80))).tolist())
        corpus = engine.corpus
        assert len(corpus) <= 300 and len(corpus.last) <= len(corpus), "only live m-grams are indexed"
        assert all(corpus.first_end <= p < corpus.end for p in corpus.last.values())
        assert len(corpus.prev) <= len(corpus.buf) <= 2 * (300 + 80), "the evicted head is dropped as the buffer grows"
    assert len(engine.corpus_ends) < 60


def test_after_evictions_the_corpus_drafts_as_if_it_held_only_the_survivors():
    rng = np.random.default_rng(2)
    engine, released = make(suffix_corpus_tokens=200), []
    for i in range(40):
        released.append(rng.integers(0, 8, size=int(rng.integers(2, 40))).tolist())
        finish(engine, f"r{i}", released[-1])
        survivors = make()
        for j, tokens in enumerate(released[-len(engine.corpus_ends):]):
            finish(survivors, f"s{j}", tokens)
        for q in range(5):
            query = rng.integers(0, 8, size=6).tolist()
            assert draft(engine, f"q{i}.{q}", query) == draft(survivors, f"q{q}", query)


def test_no_corpus_when_its_budget_is_zero():
    engine = make(suffix_corpus_tokens=0)
    finish(engine, "a", [1, 2, 3, 4])
    assert draft(engine, "q", [9, 2, 3]) == [] and len(engine.corpus) == 0


def test_incremental_state_survives_appends():
    engine = make()
    seq = [1, 2, 3, 4, 5, 6, 1, 2]
    assert draft(engine, "a", seq, k=3) == [3, 4, 5]
    stream = engine.cache.get("a").state
    seq += [3, 4, 9]
    assert draft(engine, "a", seq, k=3) == []
    seq += [1, 2, 3]
    assert draft(engine, "a", seq, k=3) == [4, 9, 1], "the appended occurrence is the most recent: it wins the tie"
    assert engine.cache.get("a").state is stream and stream.end == len(seq)


def test_state_is_rebuilt_from_the_common_prefix_after_a_rewind():
    engine = make()
    assert draft(engine, "a", [1, 2, 3, 4, 5, 6, 1, 2], k=3) == [3, 4, 5]
    assert draft(engine, "a", [1, 2, 3, 7, 8, 1, 2], k=3) == [3, 7, 8], "the tokens after 3 were replaced"
    assert draft(engine, "a", [1, 2], k=3) == []
    assert draft(engine, "a", [9, 9, 9, 1, 2, 9, 9, 1], k=3) == [2, 9, 9]


def test_incremental_drafts_equal_drafts_from_scratch():
    """Random appends and rewinds: the kept state must draft exactly what a fresh engine drafts."""
    rng = np.random.default_rng(1)
    engine = make()
    seq: list[int] = []
    for step in range(300):
        if seq and rng.random() < 0.3:
            del seq[int(rng.integers(0, len(seq) + 1)):]
        seq += rng.integers(0, 6, size=int(rng.integers(0, 5))).tolist()
        assert draft(engine, "a", seq) == draft(make(), "fresh", seq), f"step {step}: {seq}"


def test_request_output_len_and_end_id():
    engine = make()
    seq = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert draft(engine, "a", seq, k=2) == [3, 4]
    assert draft(engine, "a", seq, k=0) == []
    assert draft(engine, "a", seq, k=8, end_id=5) == [3, 4, 5]


def test_stop_and_unknown_ids():
    engine = make()
    engine.release("never-seen")
    seq = [1, 2, 3, 1, 2]
    assert engine.generate(EngineRequest.release("never-seen")).tokens == []
    draft(engine, "a", seq)
    assert engine.generate(EngineRequest.release("a")).tokens == [] and "a" not in engine.cache
    assert draft(engine, "b", [9, 2, 3], k=2) == [1, 2], "the stopped request joined the corpus"


def test_per_request_state_is_bounded():
    engine = make(max_sequences=2)
    for i in range(5):
        draft(engine, f"r{i}", [1, 2, 1])
    assert len(engine.cache) == 2 and isinstance(engine, MeteredEngine)


def test_drafts_only():
    with pytest.raises(InvalidRequest):
        make().generate(EngineRequest("a", [1, 2, 1], 2, draft=[2]))


def test_settings_are_validated_and_rendered():
    with pytest.raises(ValueError):
        make(suffix_min_match=5, suffix_max_match=4)
    settings = EngineSettings(engine="suffix", suffix_corpus_tokens=5000, suffix_min_prob=0.25)
    assert EngineSettings.from_params(settings.params()) == settings


def test_a_rendered_ssm_suffix_model_builds_the_engine_its_entry_describes(tmp_path, tiny_llm):
    """deploy.yaml entry -> config.pbtxt (the ssm_ngram template) -> EngineSettings -> SuffixEngine."""
    import re

    import yaml

    from minions.deploy.config import load_deployment
    from minions.deploy.render import render_repository

    tiny_llm.save_pretrained(tmp_path / "llm")
    entry = {"name": "ssm_suffix", "engine": "suffix", "max_sequences": 32, "suffix_max_match": 16,
             "suffix_min_match": 3, "suffix_min_prob": 0.2, "suffix_corpus_tokens": 50000}
    llm = {"name": "llm", "engine": "torch", "source": str(tmp_path / "llm")}
    raw = {"cache_dir": str(tmp_path / "cache"), "llm": llm,
           "ssms": [entry], "orchestrator": {"name": "minions", "default_speculation": "single:ssm_suffix"}}
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(raw))
    repo = render_repository(load_deployment(tmp_path / "deploy.yaml"), tmp_path / "repo")
    text = (repo / "ssm_suffix" / "config.pbtxt").read_text()
    params = dict(re.findall(r'key: "(\w+)"\s+value: {\s+string_value: "([^"]*)"', text))
    engine = build_engine(EngineSettings.from_params(params))
    assert isinstance(engine, SuffixEngine) and engine.cache.capacity == 32 and engine.corpus_tokens == 50000
    assert (engine.max_match, engine.min_match, engine.min_prob) == (16, 3, 0.2)


def grams(index: TokenIndex) -> dict[tuple[int, ...], list[int]]:
    """Where each m-gram ends (ascending), read back through the index's chains."""
    out = {}
    for p in index.last.values():
        chain = []
        while p >= index.first_end:
            chain.append(p)
            p = index.prev[p - index.offset]
        gram = tuple(index.buf[chain[0] - index.m + 1 - index.offset: chain[0] + 1 - index.offset].tolist())
        out[gram] = chain[::-1]
    return out


def test_token_index_evicts_and_truncates_exactly():
    index = TokenIndex(2)
    index.extend([1, 2, 3, 1, 2, 4])
    assert grams(index) == {(1, 2): [1, 4], (2, 3): [2], (3, 1): [3], (2, 4): [5]}
    index.truncate(4)
    assert grams(index) == {(1, 2): [1], (2, 3): [2], (3, 1): [3]}
    index.evict(2)
    assert grams(index) == {(3, 1): [3]} and len(index) == 2
    index.extend([5, 3, 1])
    assert grams(index) == {(3, 1): [3, 6], (1, 5): [4], (5, 3): [5]}


def test_token_index_truncation_after_an_eviction_forgets_evicted_ends():
    index = TokenIndex(2)
    index.extend([1, 2, 9, 1, 2])
    index.evict(1)  # (1, 2) at 1 goes; its latest end, 4, stays
    assert grams(index) == {(1, 2): [4], (2, 9): [2], (9, 1): [3]}
    index.truncate(4)
    assert grams(index) == {(2, 9): [2], (9, 1): [3]} and len(index.last) == 2


def test_gram_keys_tell_distinct_grams_apart():
    grams3 = np.array(np.meshgrid(*[np.arange(20)] * 3)).reshape(3, -1).T
    keys = {gram_keys(g, 3)[0] for g in grams3}
    assert len(keys) == len(grams3) == 8000
    assert gram_keys(np.array([1, 2, 3, 4]), 2) == [gram_keys(np.array(g), 2)[0] for g in ([1, 2], [2, 3], [3, 4])]


def test_a_key_collision_is_checked_against_the_tokens():
    """Keys are hashes: a position filed under the wrong key (as a collision would) never matches."""
    index = TokenIndex(2)
    index.extend([5, 6, 7, 1, 2, 8, 1, 2])
    index.prev[4] = 1  # the end of (1, 2) at 4 now chains to where (5, 6) ends
    length, ends = index.occurrences(np.array([9, 1, 2]))
    assert length == 2 and ends.tolist() == [4]
    assert index.continuation(ends, 3, 0.1) == ([8, 1, 2], [1.0, 1.0, 1.0])


def test_an_occurrence_with_nothing_after_it_leaves_the_others():
    engine = make()
    finish(engine, "a", [1, 2, 7, 8])
    finish(engine, "b", [5, 1, 2])  # the most recent (1, 2) ends its sequence
    assert draft(engine, "q", [9, 1, 2], k=3) == [7, 8]


def test_a_short_match_drafts_at_most_spec_factor_times_its_length():
    """Chat text shares 2-token phrases with any earlier answer: their continuation is weak evidence."""
    earlier = [1, 2, *range(100, 120)]
    limited, unlimited = make(suffix_spec_factor=2.0), make(suffix_spec_factor=0)
    for engine in (limited, unlimited):
        finish(engine, "old", earlier)
    assert draft(limited, "new", [50, 51, 1, 2], k=12) == list(range(100, 104))  # 2-token match: 4 tokens
    assert draft(unlimited, "new", [50, 51, 1, 2], k=12) == list(range(100, 112))
