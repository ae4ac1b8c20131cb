"""One model's compute steps, no more processes at a time than the cores hold: exclusive flocks on
files the model's instances share, one held for each llama.cpp decode call.

A reload through the repository API runs the model's old instance (finishing its requests) beside
the new one (taking the new requests). Each runs llama.cpp with as many threads as the deployment
gave the model, usually every core; computing at once, their threads outnumber the cores, and
llama.cpp's threads, which wait for each other at every operation of a step, crawl (measured in
docs/operations.md, "A reload while requests run"). Taking turns step by step, each step runs at
full speed. There are as many slots (files) as the cores hold the model's thread count, so the
instances of an `instance_count` above 1 on a machine with room for them still step together. A
process that dies holding a slot releases it with its file descriptor.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("minions.engines")


def step_lock_path(model_dir: str | Path) -> str:
    """The lock file of the model served from `model_dir` (Triton's `model_repository` argument: the
    same for every instance and version of the model): in the temporary directory, not in the
    repository, whose files say whether a model changed."""
    key = hashlib.sha256(os.path.realpath(model_dir).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"minions-steps-{key}.lock")


def step_slots(num_threads: int) -> int:
    """How many of the model's instances may step at once: as many as the cores this process may
    run on hold `num_threads` each (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) // max(num_threads, 1))


class StepLock:
    """`with lock:` around a step: it takes a free slot, or waits for one (this process's own,
    chosen by its pid) while every slot is held by another process."""

    def __init__(self, path: str | Path, slots: int = 1) -> None:
        self.path = str(path)
        self._fds: list[int] = []
        self._held: int | None = None
        try:
            for i in range(max(slots, 1)):
                self._fds.append(os.open(self.path if i == 0 else f"{self.path}.{i}", os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:  # a step without the lock is still a step: serve, and say so
            log.warning("steps are not shared with the model's other instances (%s: %s)", self.path, exc)
            self.close()

    def __enter__(self) -> StepLock:
        if not self._fds:
            return self
        for fd in self._fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            self._held = fd
            return self
        self._held = self._fds[os.getpid() % len(self._fds)]
        fcntl.flock(self._held, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held is not None:
            fcntl.flock(self._held, fcntl.LOCK_UN)
            self._held = None

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
