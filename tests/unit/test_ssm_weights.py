"""minions.speculation.weights: the vote's online weights."""

from __future__ import annotations

import math

import pytest

from minions.speculation.weights import SsmWeights, WeightRule, draft_score


def test_draft_score_counts_only_what_the_llm_output_can_confirm():
    assert draft_score([1, 2, 3, 4], [1, 2, 9]) == pytest.approx(2 / 3)
    assert draft_score([1, 2], [1, 2, 3, 4]) == 1.0
    assert draft_score([5], [1]) == 0.0
    assert draft_score([], [1]) is None


def test_above_average_ssms_gain_weight_within_bounds():
    w = SsmWeights(["good", "ok", "bad"], WeightRule(eta=1.0, floor=0.1, ceiling=8.0))
    w.update({"good": 0.9, "ok": 0.6, "bad": 0.0})
    got = w.snapshot()
    assert got["good"] == pytest.approx(math.exp(0.4)) and got["ok"] == pytest.approx(math.exp(0.1))
    assert got["bad"] == pytest.approx(math.exp(-0.5))
    for _ in range(50):
        w.update({"good": 0.9, "ok": 0.6, "bad": 0.0})
    assert w.snapshot() == {"good": 8.0, "ok": 8.0, "bad": 0.1}


def test_two_good_ssms_are_told_apart_where_a_fixed_threshold_could_not():
    """Both are right most of the time (above any sensible fixed threshold); the better one wins."""
    w = SsmWeights(["a", "b"])
    for _ in range(5):
        w.update({"a": 0.95, "b": 0.7})
    got = w.snapshot()
    assert got["a"] > 3.0 * got["b"]


def test_never_starved_a_recovered_ssm_climbs_back():
    w = SsmWeights(["x", "y"], WeightRule(eta=1.0, floor=0.05, ceiling=20.0))
    for _ in range(40):
        w.update({"x": 1.0, "y": 0.0})
    assert w.snapshot()["y"] == 0.05
    for _ in range(40):
        w.update({"x": 0.0, "y": 1.0})
    assert w.snapshot()["y"] == 20.0


def test_a_lone_drafter_is_not_rewarded_for_being_alone():
    w = SsmWeights(["a", "b"])
    w.update({"a": 1.0})
    w.update({})
    assert w.snapshot() == {"a": 1.0, "b": 1.0}


def test_request_weights_start_from_global_and_evolve_apart():
    g = SsmWeights(["a", "b"])
    g.update({"a": 1.0, "b": 0.0})
    r = g.child(["a", "b"])
    assert r.snapshot() == g.snapshot()
    r.update({"a": 0.0, "b": 1.0})
    assert r.snapshot()["b"] > g.snapshot()["b"] and r.snapshot()["a"] < g.snapshot()["a"]
    assert set(g.snapshot(["b"])) == {"b"}


def test_an_ssm_that_joins_starts_at_the_initial_weight_and_a_second_add_changes_nothing():
    weights = SsmWeights(["a", "b"])
    weights.update({"a": 1.0, "b": 0.0})
    before = weights.snapshot()
    weights.add("c")
    weights.add("a")
    assert weights.snapshot() == before | {"c": 1.0}
