"""triton/stubs.py: which processes count as a model's live stub."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from minions.triton.stubs import boot_clock, live_stub_pids, live_stubs, process_start_time, stub_start_times

STUB = "/build/backends/python/triton_python_backend_stub"


def _process(proc: Path, pid: int, args: list[str], state: str = "S") -> None:
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    (folder / "stat").write_text(f"{pid} (triton_python_b) {state} 1 2 3")


def test_only_live_stubs_of_the_model_count(tmp_path):
    repo = Path("/build/model_repository")
    _process(tmp_path, 10, [STUB, f"{repo}/minions/1/model.py", "region-a", "minions_0_0"])
    _process(tmp_path, 11, [STUB, f"{repo}/minions/1/model.py", "region-b", "minions_0_0"], state="Z")
    _process(tmp_path, 12, [STUB, f"{repo}/minions_v2/1/model.py", "region-c", "minions_v2_0_0"])
    _process(tmp_path, 13, [STUB, f"{repo}/llm/1/model.py", "region-d", "llm_0_0"])
    _process(tmp_path, 14, ["/usr/bin/python3", "-m", "pytest", f"{repo}/minions/1/model.py"])
    (tmp_path / "self").mkdir()
    assert live_stub_pids(repo / "minions", proc=tmp_path) == [10]
    assert live_stub_pids(repo / "llm", proc=tmp_path) == [13]
    assert live_stub_pids(repo / "ssm_ngram", proc=tmp_path) == []
    assert live_stubs(repo, proc=tmp_path) == {"minions": [10], "minions_v2": [12], "llm": [13]}


def test_a_process_start_time_is_on_the_boot_clock():
    """A stub's start time and the frontend's request times are compared (frontend/orphans.py): both
    must be on one clock, to the kernel's tick."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    before = boot_clock()
    child = subprocess.Popen(["sleep", "30"])
    try:
        started = process_start_time(child.pid)
        after = boot_clock()
    finally:
        child.kill()
        child.wait()
    assert started is not None and before - tick <= started <= after + tick
    assert process_start_time(child.pid) is None


def test_stub_start_times_reads_each_live_stubs_start(tmp_path):
    repo = Path("/build/model_repository")
    ticks = os.sysconf("SC_CLK_TCK")
    for pid, start in ((10, 5 * ticks), (11, 7 * ticks)):
        _process(tmp_path, pid, [STUB, f"{repo}/minions/1/model.py", "region", "minions_0_0"])
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (triton_python_b) S" + " 0" * 18 + f" {start} 0 0")
    assert stub_start_times(repo / "minions", proc=tmp_path) == {10: 5.0, 11: 7.0}
