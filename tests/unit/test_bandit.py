"""minions.speculation.bandit: UCB1 SSM selection rewarded by tokens per second."""

from __future__ import annotations

import random

from minions.speculation.bandit import Ucb1


def test_every_arm_is_tried_first_in_order():
    b = Ucb1(["a", "b", "c"])
    seen = []
    for _ in range(3):
        arm = b.choose(["a", "b", "c"])
        seen.append(arm)
        b.reward(arm, 1.0)
    assert seen == ["a", "b", "c"]


def test_converges_to_the_arm_with_the_best_tokens_per_second():
    rng = random.Random(0)
    rate = {"slow_accurate": 30.0, "fast_sloppy": 45.0, "useless": 10.0}
    b = Ucb1(list(rate))
    picks = []
    for _ in range(2000):
        arm = b.choose(list(rate))
        picks.append(arm)
        b.reward(arm, max(0.0, rng.gauss(rate[arm], 8.0)))
    late = picks[-500:]
    assert late.count("fast_sloppy") > 0.8 * len(late)
    assert b.means()["fast_sloppy"] > b.means()["slow_accurate"] > b.means()["useless"]


def test_rewards_stay_normalised_when_the_best_rate_grows():
    b = Ucb1(["a", "b"])
    b.reward("a", 10.0)
    b.reward("b", 40.0)
    assert b.means() == {"a": 0.25, "b": 1.0}


def test_only_available_arms_are_chosen():
    b = Ucb1(["a", "b"])
    assert b.choose(["b"]) == "b"
    assert b.choose([]) is None


def test_an_arm_that_joins_is_tried_before_the_pulled_ones():
    bandit = Ucb1(["a", "b"])
    for name in ("a", "b"):
        bandit.choose([name])
        bandit.reward(name, 10.0)
    bandit.add("c")
    bandit.add("a")
    assert bandit.choose(["a", "b", "c"]) == "c"
