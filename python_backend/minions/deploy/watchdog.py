"""`make serve`'s watchdog of the orchestrator model.

Triton 2.51 neither restarts a dead Python-backend stub nor marks its model not ready. The orchestrator
recovers the LLM and the SSMs (triton/model_control.py), but nothing inside `minions` outlives its own
stub. So `make serve` looks, every `interval_s`, for a live stub process of the model (its command line
names the model's folder in the repository); when Triton says the model is READY and none is alive, it
loads the model again through the repository API, as an operator would.
"""

from __future__ import annotations

import logging
from pathlib import Path

import tritonclient.grpc as grpcclient

from minions.triton.model_control import mark_modified

log = logging.getLogger("minions.watchdog")

WATCH_INTERVAL_S = 2.0
"""How often `make serve` looks for the orchestrator's stub: a dead one is loaded again within this."""


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


class StubWatchdog:
    """Loads `model` again when Triton reports it ready but no stub of it is alive."""

    def __init__(self, repository: Path, model: str, grpc_url: str) -> None:
        self.repository = repository
        self.model = model
        self.grpc_url = grpc_url

    def check(self) -> bool:
        """One look; True when the model's stub was dead and the model was loaded again."""
        with grpcclient.InferenceServerClient(self.grpc_url) as triton:
            if not triton.is_model_ready(self.model) or live_stub_pids(self.repository / self.model):
                return False
            log.error("%s: its stub has died; loading its model again", self.model)
            mark_modified(self.repository, self.model)
            triton.load_model(self.model)
        log.warning("%s: model loaded again", self.model)
        return True
