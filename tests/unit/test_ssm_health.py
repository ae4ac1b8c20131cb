"""minions.speculation.health: the breaker that keeps a failing SSM from costing every round a failed call."""

from minions.speculation.health import SsmHealth


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_failures_in_a_row_and_recovers_after_cooldown():
    clock = Clock()
    health = SsmHealth(threshold=2, cooldown_s=10, clock=clock)
    assert health.available("a")
    assert health.failed("a") is False and health.available("a")
    assert health.failed("a") is True and not health.available("a")
    assert health.available("b"), "breakers are per SSM"
    clock.now = 9.9
    assert not health.available("a")
    clock.now = 10.0
    assert health.available("a")


def test_a_success_resets_the_count():
    health = SsmHealth(threshold=2, cooldown_s=10, clock=Clock())
    health.failed("a")
    health.succeeded("a")
    assert health.failed("a") is False and health.available("a")
