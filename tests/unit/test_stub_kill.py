"""harness/stub_kill.py on a real process: a child that holds a robust, process-shared pthread
mutex (what python_backend's shared-memory mutexes are) is seen holding it, and is killed only once
it has let it go."""

from __future__ import annotations

import signal
import subprocess
import sys

from harness.stub_kill import kill_outside_locks, stopped_outside_locks

HOLDER = """
import ctypes, sys
libc = ctypes.CDLL(None)
attr, mutex = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
libc.pthread_mutexattr_init(attr)
libc.pthread_mutexattr_setpshared(attr, 1)  # PTHREAD_PROCESS_SHARED
libc.pthread_mutexattr_setrobust(attr, 1)  # PTHREAD_MUTEX_ROBUST
assert libc.pthread_mutex_init(mutex, attr) == 0
for step in ("locked", "unlocked"):
    sys.stdin.readline()
    assert (libc.pthread_mutex_lock if step == "locked" else libc.pthread_mutex_unlock)(mutex) == 0
    print(step, flush=True)
sys.stdin.readline()
"""


def test_a_process_holding_a_robust_mutex_is_killed_only_once_it_lets_go():
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert stopped_outside_locks(child.pid)  # nothing locked yet
        child.send_signal(signal.SIGCONT)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "locked\n"
        assert not stopped_outside_locks(child.pid)
        child.send_signal(signal.SIGCONT)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "unlocked\n"
        assert kill_outside_locks(child.pid) == 1
        assert child.wait(10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
