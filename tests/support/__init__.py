"""What the tests stand on and the benchmarks may import: the real tritonserver as a process
(triton_process.py) and the near-tie check of greedy divergences (near_tie.py)."""
