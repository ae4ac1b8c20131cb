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


def test_an_ssm_not_ready_is_skipped_and_ready_again_gets_a_closed_breaker():
    clock = Clock()
    health = SsmHealth(threshold=1, cooldown_s=100, clock=clock)
    health.failed("a")
    health.set_ready("a", False)
    assert not health.available("a")
    clock.now = 200.0
    assert not health.available("a"), "not ready outlasts the cooldown"
    clock.now = 50.0
    health.set_ready("a", True)
    assert health.available("a"), "loaded again: tried at once, not after the cooldown"


def test_ready_again_and_again_keeps_the_breaker():
    health = SsmHealth(threshold=1, cooldown_s=100, clock=Clock())
    health.failed("a")
    health.set_ready("a", True)
    assert not health.available("a"), "only a transition from not ready closes the breaker"


def test_the_hook_hears_why_the_breaker_opened():
    opened = []
    health = SsmHealth(threshold=2, clock=Clock())
    health.on_open = lambda ssm, reason: opened.append((ssm, reason))
    health.failed("a", "Stub process 'a_0_0' is not healthy.")
    assert opened == []
    health.failed("a", "Stub process 'a_0_0' is not healthy.")
    assert opened == [("a", "Stub process 'a_0_0' is not healthy.")]
