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
from minions.triton.stubs import live_stub_pids

log = logging.getLogger("minions.watchdog")

WATCH_INTERVAL_S = 2.0
"""How often `make serve` looks for the orchestrator's stub: a dead one is loaded again within this."""


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
