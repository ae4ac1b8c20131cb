"""Client streams for the benchmarks: a fixed number of threads pulling prompts from one queue."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_streams(items: list[T], streams: int, call: Callable[[T], R],
                done: Callable[[int, R], None], failed: Callable[[Exception], None]) -> float:
    """`call` on every item from `streams` threads, each taking the next item when its last call ends;
    `done(index, result)` and `failed(exception)` run under one lock. Returns the wall time from the
    first start to the last end. A failed call is reported and the run goes on."""
    work: queue.Queue = queue.Queue()
    for item in enumerate(items):
        work.put(item)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                i, item = work.get_nowait()
            except queue.Empty:
                return
            try:
                result = call(item)
            except Exception as exc:  # counted and reported, the run goes on
                with lock:
                    failed(exc)
                continue
            with lock:
                done(i, result)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start
