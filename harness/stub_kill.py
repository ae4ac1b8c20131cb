"""SIGKILL a Python-backend stub at a moment it holds no shared-memory lock.

tritonserver 2.51 aborts itself (`boost::interprocess::lock_exception`, docs/operations.md) when a stub
dies owning a mutex of its shared-memory region: python_backend's mutexes there are robust, the parent's
next lock of it fails with owner-dead, and nothing catches that. A test that kills a stub is about what
Minions does after the death, not about that window, so it kills the stub stopped (SIGSTOP) at a point
where no thread of it owns a robust mutex or is taking or releasing one: the kernel's robust-futex list
of every thread (get_robust_list(2), read through /proc/<pid>/mem) is empty and has nothing pending.
Where the list is not empty the stub runs on (SIGCONT) and is stopped again a moment later. Linux only.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import time
from pathlib import Path

_GET_ROBUST_LIST = {"x86_64": 274, "aarch64": 100}[platform.machine()]
"""The syscall's number (asm/unistd.h)."""
_libc = ctypes.CDLL(None, use_errno=True)


def _threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _state(pid: int, tid: int) -> str:
    """A thread's state letter in /proc (R, S, D, T for stopped, t, Z, ...); 'X' once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "X"
    return stat[stat.rindex(")") + 2]


def _robust_list_busy(pid: int, tid: int, mem: int) -> bool:
    """Whether thread `tid` owns a robust mutex, or is taking or releasing one (glibc sets
    list_op_pending for that while it works on the list)."""
    head, size = ctypes.c_void_p(), ctypes.c_size_t()
    if _libc.syscall(_GET_ROBUST_LIST, tid, ctypes.byref(head), ctypes.byref(size)) != 0:
        raise OSError(ctypes.get_errno(), f"get_robust_list of thread {tid} of {pid}")
    if not head.value:  # the thread never registered a list: it cannot own a robust mutex
        return False
    first, _offset, pending = struct.unpack("qqq", os.pread(mem, 24, head.value))
    return first != head.value or pending != 0


def stopped_outside_locks(pid: int) -> bool:
    """Stop `pid` (SIGSTOP) and say whether it holds no robust mutex now; it stays stopped either way."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while any(_state(pid, tid) not in "TtXZ" for tid in _threads(pid)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not stop within 5 s of SIGSTOP")
        time.sleep(0.0002)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return not any(_robust_list_busy(pid, tid, mem) for tid in _threads(pid) if _state(pid, tid) in "Tt")
    finally:
        os.close(mem)


def kill_outside_locks(pid: int, attempts: int = 1000) -> int:
    """SIGKILL `pid` once it is stopped holding no robust mutex; returns how many stops that took.
    ProcessLookupError if it is gone."""
    try:
        return _kill_outside_locks(pid, attempts)
    except FileNotFoundError as exc:  # its /proc entries went with it
        raise ProcessLookupError(f"no process {pid}") from exc


def _kill_outside_locks(pid: int, attempts: int) -> int:
    for attempt in range(1, attempts + 1):
        if stopped_outside_locks(pid):
            os.kill(pid, signal.SIGKILL)
            return attempt
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)  # let it run past the lock before the next look
    os.kill(pid, signal.SIGCONT)
    raise TimeoutError(f"process {pid} held a shared-memory lock at each of {attempts} stops")
