"""minions.speculation.voting: prefix-tree merge of drafts and the heaviest-path vote."""

from __future__ import annotations

import itertools
import random

import pytest

from minions.speculation.voting import dominant, heaviest_path, merge_drafts, vote


def test_merge_shares_prefixes_and_sums_weights():
    root = merge_drafts({"a": [1, 2, 3], "b": [1, 2, 4], "c": [5]}, {"a": 1.0, "b": 2.0, "c": 0.5})
    assert root.weight == pytest.approx(3.5)
    assert set(root.children) == {1, 5}
    assert root.children[1].weight == pytest.approx(3.0)
    assert root.children[1].children[2].ssms == ["b", "a"]  # heaviest first
    assert root.children[1].children[2].children[3].weight == pytest.approx(1.0)
    assert root.children[1].children[2].children[4].weight == pytest.approx(2.0)
    assert nodes(root) == 1 + 4 + 1


def nodes(node) -> int:
    return 1 + sum(nodes(c) for c in node.children.values())


def test_majority_of_light_ssms_beats_one_heavier_ssm():
    drafts = {"big": [1, 2, 3], "x": [7, 8, 9], "y": [7, 8, 0]}
    v = vote(drafts, {"big": 1.5, "x": 1.0, "y": 1.0})
    assert v.draft in ([7, 8, 9], [7, 8, 0])
    assert v.draft[:2] == [7, 8]
    # below the shared prefix, the heavier of x and y decides
    assert vote(drafts, {"big": 1.5, "x": 1.0, "y": 1.2}).draft == [7, 8, 0]
    assert vote(drafts, {"big": 2.5, "x": 1.0, "y": 1.2}).draft == [1, 2, 3]


def test_ties_go_to_the_heavier_ssm_then_to_the_callers_order():
    assert vote({"a": [1], "b": [2]}, {"a": 1.0, "b": 1.0}).draft == [1]
    assert vote({"b": [2], "a": [1]}, {"a": 1.0, "b": 1.0}).draft == [2]


def test_empty_drafts_vote_but_add_no_path():
    assert vote({"a": [], "b": []}, {"a": 1.0, "b": 1.0}).draft == []
    v = vote({"a": [], "b": [4, 5]}, {"a": 9.0, "b": 1.0})
    assert v.draft == [4, 5] and v.supporters == ["b"]


def test_the_voted_path_is_always_one_real_ssm_draft():
    """Whatever the drafts and weights, the result is exactly the draft of each of its supporters."""
    rng = random.Random(0)
    for _ in range(500):
        names = [f"s{i}" for i in range(rng.randint(1, 5))]
        drafts = {n: [rng.randint(0, 2) for _ in range(rng.randint(0, 4))] for n in names}
        weights = {n: rng.uniform(0.05, 5.0) for n in names}
        v = vote(drafts, weights)
        assert v.supporters, "the path ends at some SSM's draft"
        for s in v.supporters:
            assert drafts[s] == v.draft
        # and it is the heaviest choice at its first step
        if v.draft:
            first = {}
            for n, d in drafts.items():
                if d:
                    first[d[0]] = first.get(d[0], 0.0) + weights[n]
            assert first[v.draft[0]] == pytest.approx(max(first.values()))


def test_a_dominant_ssms_draft_starts_every_voted_path():
    """Others can only extend it past its end (when it drafted fewer tokens), never change it."""
    assert dominant({"a": 3.0, "b": 1.0, "c": 1.0}) == "a"
    assert dominant({"a": 2.0, "b": 1.0, "c": 1.0}) is None
    assert dominant({}) is None
    weights = {"a": 3.0, "b": 1.0, "c": 1.5}
    for da, db, dc in itertools.product([[1, 2], [2, 1], [1]], repeat=3):
        voted = vote({"a": da, "b": db, "c": dc}, weights).draft
        assert voted[: len(da)] == da
        assert voted == da or voted in (db, dc)


def test_heaviest_path_of_an_empty_tree():
    root = merge_drafts({}, {})
    v = heaviest_path(root)
    assert v.draft == [] and v.supporters == [] and nodes(root) == 1
