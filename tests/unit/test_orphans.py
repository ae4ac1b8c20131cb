"""frontend/orphans.py: which generations a vanished orchestrator stub left unanswered, on a fake stub
table and clock (the real /proc and a real kill: tests/integration/test_make_serve.py)."""

from __future__ import annotations

import asyncio

from minions.frontend.orphans import OrphanWatch, orphan_bound


def test_the_bound_is_the_start_of_the_first_stub_newer_than_the_vanished_ones():
    assert orphan_bound({1: 5.0}, {1: 5.0}, observed_at=30.0) is None
    assert orphan_bound({1: 5.0}, {}, observed_at=30.0) == 30.0  # none newer yet: all sent so far
    assert orphan_bound({1: 5.0}, {2: 20.0, 3: 25.0}, observed_at=30.0) == 20.0
    # A reload: the old stub exits after the new one started; what was sent since may be on the new one.
    assert orphan_bound({1: 5.0, 2: 20.0}, {2: 20.0}, observed_at=30.0) == 20.0
    assert orphan_bound({1: 5.0}, {1: 21.0}, observed_at=30.0) == 21.0  # pid reused by a new stub
    assert orphan_bound({}, {1: 5.0}, observed_at=30.0) is None


class World:
    """The stubs alive and the time, set by the test."""

    def __init__(self, stubs: dict[int, float], now: float) -> None:
        self.stubs, self.now = stubs, now

    def watch(self, grace_s: float = 2.0) -> OrphanWatch:
        # The loop's own polls wait an hour: the test polls.
        return OrphanWatch(lambda: dict(self.stubs), lambda: self.now, grace_s=grace_s, interval_s=3600)


class Generation:
    def __init__(self, watch: OrphanWatch) -> None:
        self.cancelled = 0
        self.watched = watch.watch(self.cancel)

    def cancel(self) -> None:
        self.cancelled += 1


def test_a_generation_on_a_killed_stub_ends_once_it_stays_silent_past_the_grace():
    async def run():
        world = World({1: 5.0}, now=10.0)
        watch = world.watch()
        generation = Generation(watch)
        world.now, world.stubs = 11.0, {}  # killed
        assert watch.poll() == []
        world.now = 12.9
        assert watch.poll() == [] and generation.cancelled == 0
        world.now, world.stubs = 13.0, {2: 12.5}  # loaded again meanwhile
        assert watch.poll() == [generation.watched]
        assert generation.cancelled == 1 and generation.watched.orphaned
        world.now = 20.0
        assert watch.poll() == [] and generation.cancelled == 1  # forgotten once ended

    asyncio.run(run())


def test_a_reload_ends_nothing_a_live_stub_answers_and_nothing_sent_to_the_new_stub():
    async def run():
        world = World({1: 5.0}, now=10.0)
        watch = world.watch()
        old = Generation(watch)  # on stub 1, finishing as the reload retires it
        world.now, world.stubs = 21.0, {1: 5.0, 2: 20.0}  # the new instance's stub started at 20
        new = Generation(watch)  # silent for long: queued for a slot
        assert watch.poll() == []
        world.now, world.stubs = 25.0, {2: 20.0}  # the old stub exits after its requests
        assert watch.poll() == []
        world.now = 25.1
        watch.heard(old.watched)  # its last response was on its way
        world.now = 40.0
        assert watch.poll() == []
        assert (old.cancelled, new.cancelled) == (0, 0)
        assert not old.watched.orphaned and not new.watched.orphaned

    asyncio.run(run())


def test_a_silent_generation_is_never_ended_while_its_stub_lives():
    async def run():
        world = World({1: 5.0}, now=10.0)
        watch = world.watch()
        waiting = Generation(watch)
        for world.now in (100.0, 1000.0):
            assert watch.poll() == []
        assert waiting.cancelled == 0

    asyncio.run(run())


def test_a_forgotten_generation_is_not_ended():
    async def run():
        world = World({1: 5.0}, now=10.0)
        watch = world.watch()
        done = Generation(watch)
        watch.forget(done.watched)
        world.now, world.stubs = 11.0, {}
        watch.poll()
        world.now = 20.0
        assert watch.poll() == [] and done.cancelled == 0

    asyncio.run(run())
