"""StepLock across real processes: a model's instances (here a child process holding the file as a
reload's other instance would) take turns, as many at once as there are slots, and a process that
dies holding a slot frees it."""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import signal

import pytest

from minions.engines.step_lock import StepLock, step_lock_path, step_slots


def _hold(path: str, slots: int, held, release) -> None:
    with StepLock(path, slots):
        held.set()
        release.wait()


def _holder(path: str, slots: int = 1):
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(path, slots, held, release))
    child.start()
    assert held.wait(30), "the child never took the lock"
    return child, release


def _free(path: str) -> bool:
    """Whether no process holds the file's lock now (asked without waiting)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def test_a_step_holds_the_file_the_other_instances_wait_on(tmp_path):
    path = str(tmp_path / "steps.lock")
    child, release = _holder(path)
    try:
        assert not _free(path)
        release.set()
        child.join(30)
        lock = StepLock(path)
        with lock:  # taken once the other process's step is over
            assert not _free(path)
        assert _free(path)
        lock.close()
    finally:
        child.kill()


@pytest.mark.timeout(60)
def test_two_slots_let_two_instances_step_at_once(tmp_path):
    path = str(tmp_path / "steps.lock")
    child, release = _holder(path, slots=2)
    lock = StepLock(path, slots=2)
    try:
        with lock:  # the second slot: no wait (a wait would run into the timeout)
            assert not _free(path) and not _free(f"{path}.1")
    finally:
        lock.close()
        release.set()
        child.join(30)


def test_a_killed_holder_frees_its_slot(tmp_path):
    path = str(tmp_path / "steps.lock")
    child, _ = _holder(path)
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert _free(path)


def test_every_instance_of_a_model_shares_one_file_and_other_models_do_not(tmp_path):
    (tmp_path / "llm").mkdir()
    (tmp_path / "ssm").mkdir()
    assert step_lock_path(tmp_path / "llm") == step_lock_path(f"{tmp_path}/./llm")
    assert step_lock_path(tmp_path / "llm") != step_lock_path(tmp_path / "ssm")


def test_a_lock_that_cannot_be_made_leaves_steps_unshared_and_says_so(tmp_path, caplog):
    path = tmp_path / "missing" / "steps.lock"
    with caplog.at_level(logging.WARNING, logger="minions.engines"):
        lock = StepLock(path)
    assert "steps are not shared with the model's other instances" in caplog.text
    with lock:  # no file, no lock: the step runs
        pass
    lock.close()
    assert not path.parent.exists(), "nothing was made"


def test_slots_are_the_cores_over_the_threads():
    cores = len(os.sched_getaffinity(0))
    assert step_slots(cores) == 1
    assert step_slots(cores + 1) == 1
    assert step_slots(1) == cores
