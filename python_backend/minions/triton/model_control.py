"""The orchestrator's view of Triton's model repository (explicit model control): which SSM models
are ready, and reloading one whose stub died.

Triton 2.51 neither restarts a dead Python-backend stub nor marks its model not ready: requests to it
fail with "Stub process ... is not healthy" until the model is loaded again. So the orchestrator asks
Triton for the repository's state every `poll_interval_s` (an SSM an operator unloaded, or one that is
reloading, is skipped; one loaded again is used at once), and when an SSM's breaker opens on a dead
stub it loads the model again through the repository API, as an operator would.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from tritonclient.grpc import service_pb2

from minions.serving.metric_tally import MetricTally
from minions.speculation.health import SsmHealth
from minions.triton.shm import sweep_orphaned_shm

from .engine_client import TritonEngineClient

log = logging.getLogger("minions.models")

DEAD_STUB = "is not healthy"
"""What Triton's Python backend says of a request to a model whose stub has died."""


SWEEP_DELAYS_S = (1.0, 2.0, 4.0, 8.0)


class ModelControl:
    def __init__(self, client: TritonEngineClient, repository: Path, ssms: tuple[str, ...], health: SsmHealth,
                 tally: MetricTally, poll_interval_s: float, reload: bool) -> None:
        self.client = client
        self.repository = repository
        self.ssms = ssms
        self.health = health
        self.tally = tally
        self.poll_interval_s = poll_interval_s
        self.reload = reload
        self.ready: dict[str, bool] = {}
        self._reloading: dict[str, asyncio.Task] = {}
        health.on_open = self.breaker_opened

    async def watch(self) -> None:
        """Follow the SSM models' readiness while the orchestrator is loaded (a task on its event loop)."""
        while True:
            try:
                await self.poll()
            except Exception as exc:  # the server is starting or stopping: the next poll tries again
                log.debug("could not read the model repository's index: %s", exc)
            await asyncio.sleep(self.poll_interval_s)

    async def poll(self) -> None:
        index = await self.client.service().RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=False))
        states = {m.name: (m.state, m.reason) for m in index.models}
        for ssm in self.ssms:
            state, reason = states.get(ssm, ("UNAVAILABLE", "not in the repository"))
            self._set_ready(ssm, state == "READY", f"{state}{f': {reason}' if reason else ''}")

    def _set_ready(self, ssm: str, ready: bool, state: str) -> None:
        if ready and ssm in self._reloading:  # the dead stub's model until its reload is done
            return
        if self.ready.get(ssm) != ready:
            if ready:
                log.info("SSM %s is ready: requests use it again", ssm)
            else:
                log.warning("SSM %s is not ready (%s): requests draft without it", ssm, state)
            self.tally.set("minions_ssm_ready", float(ready), ssm=ssm)
        self.ready[ssm] = ready
        self.health.set_ready(ssm, ready)

    def breaker_opened(self, ssm: str, reason: str) -> None:
        """SsmHealth's hook: an SSM failed `threshold` times in a row; reload its model if its stub died."""
        if not (self.reload and DEAD_STUB in reason) or ssm in self._reloading:
            return
        self._reloading[ssm] = asyncio.get_running_loop().create_task(self._reload(ssm))

    def _mark_modified(self, model: str) -> None:
        """Triton loads a model again only if its files changed since it was loaded: a load of an
        unchanged model is a no-op (its config alone changed: an update without new instances)."""
        for path in (self.repository / model).glob("[0-9]*/*"):
            os.utime(path)

    async def _reload(self, ssm: str) -> None:
        log.error("SSM %s: its stub has died; loading its model again", ssm)
        self._set_ready(ssm, False, "its stub died")
        try:
            self._mark_modified(ssm)
            await self.client.service().RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name=ssm))
            outcome = "success"
            log.warning("SSM %s: model loaded again", ssm)
        except Exception as exc:
            outcome = "error"
            log.error("SSM %s: loading its model again failed (%s); it stays skipped until an operator loads it",
                      ssm, exc)
        finally:
            del self._reloading[ssm]
        self.tally.add("minions_ssm_reloads", 1, ssm=ssm, outcome=outcome)
        if outcome == "success":
            self._set_ready(ssm, True, "READY")
        # The dead stub's shared memory, which neither it nor Triton frees, once tritonserver unmaps it
        # as it unloads the old instance, about a second after the new one is ready. (Not for a
        # decoupled model: Triton 2.51 keeps its old instance, and region, while requests the dead
        # stub never answered are pending, until the server stops; its stop path sweeps it then.)
        for delay_s in SWEEP_DELAYS_S:
            await asyncio.sleep(delay_s)
            if sweep_orphaned_shm():
                break
