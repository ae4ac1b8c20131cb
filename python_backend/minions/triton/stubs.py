"""The Python-backend stub processes of a model, found by their command lines: Triton 2.51 neither
restarts a dead stub nor marks its model not ready, so whether a stub lives is read from /proc (the
orchestrator's models and tritonserver share the host)."""

from __future__ import annotations

from pathlib import Path


def live_stub_pids(model_dir: Path, proc: Path = Path("/proc")) -> list[int]:
    """Python-backend stub processes serving the model in `model_dir`, zombies excluded."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if state != "Z" and args and args[0].endswith(b"triton_python_backend_stub") and \
                any(a.startswith(f"{model_dir}/".encode()) for a in args[1:]):
            pids.append(int(entry.name))
    return pids
