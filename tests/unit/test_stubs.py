"""triton/stubs.py: which processes count as a model's live stub."""

from __future__ import annotations

from pathlib import Path

from minions.triton.stubs import live_stub_pids, live_stubs

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
