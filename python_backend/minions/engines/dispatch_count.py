"""Counts the torch operators a block of code dispatches (aten ops, as TorchDispatchMode sees them).

On a GPU each one is at least one kernel launch, and on any device each costs the Python and dispatcher
overhead that dominates a small model's step; the packed forward is built so that this count does not
grow with the rows of a step or their draft lengths (benchmarks/bench_forward_ops.py, its unit test)."""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode


class DispatchCount(TorchDispatchMode):
    """`with DispatchCount() as count: ...`; then `count.total` and `count.ops` (by operator name)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())
