"""The orchestrator's view of Triton's model repository (explicit model control): which of its models
are ready, and reloading one whose stub died.

Triton 2.51 neither restarts a dead Python-backend stub nor marks its model not ready: requests to it
fail with "Stub process ... is not healthy" until the model is loaded again. So the orchestrator asks
Triton for the repository's state every `poll_interval_s` (an SSM an operator unloaded, or one that is
reloading, is skipped; one loaded again is used at once), and when an SSM's breaker opens on a dead
stub it loads the model again through the repository API, as an operator would.

The LLM has no stand-in: while it is not ready requests are refused at once (UNAVAILABLE) rather than
left to fail after the engine stall timeout. Its stub's death is found by a probe each poll (a `stop`
of a sequence that does not exist, which a live stub answers at once), or by any call that fails so;
then every call waiting on it ends at once with UNAVAILABLE, and its model is loaded again. The SSMs
are probed the same way. A model found not ready, or ready with other stub processes than at the
last poll (loaded again), has its gRPC stream closed once answered, so that Triton unloads the old
instance then.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from tritonclient.grpc import service_pb2

from minions.decoding.engine_call import EngineRequest
from minions.errors import ModelUnavailable
from minions.serving.metric_tally import MetricTally
from minions.speculation.services import Services
from minions.triton.shm import sweep_orphaned_shm
from minions.triton.stubs import live_stubs

from .engine_client import TritonEngineClient

log = logging.getLogger("minions.models")

DEAD_STUB = "is not healthy"
"""What Triton's Python backend says of a request to a model whose stub has died."""


SWEEP_DELAYS_S = (1.0, 2.0, 4.0, 8.0)
"""After a stub's replacement, the waits before each look for its shared memory to sweep."""

TRTLLM_BACKEND = "tensorrtllm"
"""The `backend` of TensorRT-LLM's own engine models in config.pbtxt (tensorrtllm_backend's `tensorrt_llm`)."""

PROBE_ID = "minions-health-probe"
"""The sequence the LLM probe stops: none has this id, so a live stub answers at once and keeps nothing."""

PROBE_TIMEOUT_S = 5.0
"""A probe waits this long at most, so that one unanswered call does not hold up the next poll."""


def mark_modified(repository: Path, model: str) -> None:
    """Touch a model's version files before loading it again: Triton loads a model again only if its files
    changed since it was loaded; a load of an unchanged model is a no-op (its config alone changed: an
    update without new instances)."""
    for path in (repository / model).glob("[0-9]*/*"):
        os.utime(path)


class ModelControl:
    def __init__(self, client: TritonEngineClient, repository: Path, services: Services,
                 tally: MetricTally, poll_interval_s: float, reload: bool,
                 on_join: Callable[[str, bool, bool], None] | None = None, *,
                 stubs: Callable[[Path], dict[str, list[int]]] = live_stubs,
                 sweep_delays_s: Sequence[float] = SWEEP_DELAYS_S) -> None:
        """The models watched are `services.llm` and `services.ssms`, the served ones. `on_join(name,
        decoupled, native)`: a new SSM model was found READY in the repository (`_discover`; native: served
        by TensorRT-LLM's own backend); it must add the SSM to `services`, and a native one to the
        client's `native_models` (which are not watched as stubs). `stubs`: the live stub pids of each
        model of the repository (stubs.live_stubs: this machine's processes); `sweep_delays_s`: the
        waits before each look for a replaced stub's shared memory."""
        self.client = client
        self.repository = repository
        self.llm = services.llm
        self.llm_unavailable: str | None = None
        """Why requests are refused now (the LLM is not ready, or its stub died); None while it serves."""
        self._llm_ready_exported: float | None = None
        self.services = services
        self.health = services.health
        self.tally = tally
        self.poll_interval_s = poll_interval_s
        self.reload = reload
        self.ready: dict[str, bool] = {}
        self._reloading: dict[str, asyncio.Task] = {}
        self.on_join = on_join
        self.stubs = stubs
        self.sweep_delays_s = tuple(sweep_delays_s)
        self._stubs_when_ready: dict[str, frozenset[int]] = {}
        """Each engine model's live stub pids at the last poll that found it ready (`_retire_replaced`)."""
        self._not_ssms: set[str] = set()
        """READY models found not to be engine models (the orchestrator itself, a client's own models)."""
        self.health.on_open = self.ssm_failed

    @property
    def ssms(self) -> tuple[str, ...]:
        return self.services.ssms

    async def watch(self) -> None:
        """Follow the models' readiness while the orchestrator is loaded (a task on its event loop, from
        load on)."""
        await self._listening()
        while True:
            try:
                await self.poll()
            except Exception as exc:  # the server is starting or stopping: the next poll tries again
                log.debug("could not read the model repository's index: %s", exc)
            await asyncio.sleep(self.poll_interval_s)

    async def _listening(self) -> None:
        """Wait until tritonserver accepts connections on its gRPC port (it opens it once its startup models
        are loaded): a gRPC channel that tried before backs off its reconnects, and a request sent in that
        back-off fails at once with `failed to connect to all addresses`."""
        host, _, port = self.client.url.rpartition(":")
        while True:
            try:
                _, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                await asyncio.sleep(self.poll_interval_s)
                continue
            writer.close()
            await writer.wait_closed()
            return

    async def _states(self) -> dict[str, tuple[str, str]]:
        """Each model of the repository's (state, reason), as Triton's index says now."""
        index = await self.client.service().RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=False))
        return {m.name: (m.state, m.reason) for m in index.models}

    async def poll(self) -> None:
        states = await self._states()

        def described(model: str) -> tuple[bool, str]:
            state, reason = states.get(model, ("UNAVAILABLE", "not in the repository"))
            return state == "READY", f"{state}{f': {reason}' if reason else ''}"

        await self._discover(states)
        for ssm in self.ssms:
            self._set_ready(ssm, *described(ssm))
        if self.llm not in self._reloading:
            ready, state = described(self.llm)
            self._set_llm(None if ready else f"the LLM model {self.llm!r} is not ready ({state}): retry later")
        # Watched, not only through requests: a dead stub that requests seldom ask (an SSM the vote
        # rarely waits for, an LLM while every request streams) would go unnoticed. A model Triton calls
        # ready with no live stub process has died; one with a live stub is probed.
        # Only Python stubs: TensorRT-LLM's own models are neither stubs nor keep sequences.
        ready = {m: described(m)[0] for m in (self.llm, *self.ssms) if m not in self.client.native_models}
        stubs = self.stubs(self.repository) if ready else {}
        self._retire_replaced({m: (r, frozenset(stubs.get(m, ()))) for m, r in ready.items()})
        watched = [m for m, r in ready.items() if r and m not in self._reloading]  # not being loaded again
        dead = {m: f"no live stub process: it {DEAD_STUB}" for m in watched if not stubs.get(m)}
        if dead:  # an operator's unload since the index was read also ends the stub, and then Triton says so
            now = await self._states()
            dead = {m: why for m, why in dead.items() if now.get(m, ("",))[0] == "READY"}
        probed = [m for m in watched if m not in dead]
        failures = dict(zip(probed, await asyncio.gather(*(self._probe(m) for m in probed)))) | dead
        for model, failure in failures.items():
            if failure is None:
                continue
            if model == self.llm:
                self.llm_failed(failure)
            else:
                self.ssm_failed(model, failure)

    def _retire_replaced(self, models: dict[str, tuple[bool, frozenset[int]]]) -> None:
        """Close the streams to each model (ready, its live stub pids) that is not ready, or whose stubs
        changed since the last poll that found it ready (a load, an operator's or ours, started a new
        instance): its old instance is unloaded once no stream that called it is open
        (`TritonEngineClient.retire_streams`), not kept for the streams' lifetime."""
        for model, (ready, pids) in models.items():
            if not ready or self._stubs_when_ready.get(model, pids) != pids:
                self.client.retire_streams(model)
            if ready:
                self._stubs_when_ready[model] = pids

    async def _discover(self, states: dict[str, tuple[str, str]]) -> None:
        """A READY model the orchestrator does not know yet that is an engine model is a new SSM: one of
        Minions' (its config has the `engine` parameter that the renderer writes) or TensorRT-LLM's own
        (`backend: "tensorrtllm"`, as tensorrtllm_backend's `tensorrt_llm` model). It joins the served
        ones, for `vote`, `bandit` and `single:<name>` from the next request on. One unloaded later is
        skipped as any SSM that is not ready. Any other model (a BLS, pre- or postprocessing) is not."""
        if self.on_join is None:
            return
        for name, (state, _) in states.items():
            if state != "READY" or name == self.llm or name in self.ssms or name in self._not_ssms:
                continue
            try:
                reply = await self.client.service().ModelConfig(service_pb2.ModelConfigRequest(name=name))
            except Exception as exc:  # unloaded since the index was read: the next poll looks again
                log.debug("could not read %s's config: %s", name, exc)
                continue
            native = reply.config.backend == TRTLLM_BACKEND
            if "engine" not in reply.config.parameters and not native:
                self._not_ssms.add(name)
                continue
            log.info("SSM %s joined: %s engine model loaded into the repository; requests draft with it", name,
                     "a TensorRT-LLM" if native else "an")
            self.on_join(name, reply.config.model_transaction_policy.decoupled, native)

    async def _probe(self, model: str) -> str | None:
        """Stop a sequence that does not exist: a live stub answers at once, or after the step it is
        in. The failure's message, if any (a probe still unanswered after PROBE_TIMEOUT_S is none: the
        model may be busy with a long prefill)."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self.client.generate(model, EngineRequest.release(PROBE_ID))
        except TimeoutError:
            return None
        except Exception as exc:
            return str(exc)
        return None

    def llm_failed(self, reason: str) -> None:
        """A call to the LLM failed: if its stub died, end the calls waiting on it and load it again."""
        if DEAD_STUB not in reason or self.llm in self._reloading:
            return
        log.error("LLM %s: its stub has died; ending the calls waiting on it and loading its model again", self.llm)
        self._set_llm(f"the LLM model {self.llm!r} died and is being loaded again: retry later")
        self.client.fail_model(self.llm, ModelUnavailable(self.llm_unavailable))
        self._reloading[self.llm] = asyncio.get_running_loop().create_task(self._reload_llm())

    def _set_llm(self, unavailable: str | None) -> None:
        ready = float(unavailable is None)
        if (unavailable is None) != (self.llm_unavailable is None):
            if unavailable is None:
                log.info("LLM %s is ready: requests are served again", self.llm)
            else:
                log.warning("%s; requests are refused", unavailable)
        if ready != self._llm_ready_exported:
            self.tally.set("minions_llm_ready", ready)
            self._llm_ready_exported = ready
        self.llm_unavailable = unavailable

    async def _reload_llm(self) -> None:
        outcome = await self._load_again(self.llm)
        del self._reloading[self.llm]
        self.tally.add("minions_llm_reloads", 1, outcome=outcome)
        if outcome == "success":
            self._set_llm(None)
        await self._sweep_shm()

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

    def ssm_failed(self, ssm: str, reason: str) -> None:
        """An SSM failed (`threshold` times in a row: SsmHealth's hook; or its poll found it dead). If its
        stub died: end the calls waiting on it at once (a draft asked just before the death is never
        answered, and would hold its round for the call timeout), and reload its model."""
        if DEAD_STUB not in reason or ssm in self._reloading:
            return
        self.client.fail_model(ssm, ModelUnavailable(f"SSM {ssm!r}: {reason}"))
        if self.reload:
            self._reloading[ssm] = asyncio.get_running_loop().create_task(self._reload(ssm))

    async def _load_again(self, model: str) -> str:
        """Load a model whose stub died through the repository API; the outcome, logged."""
        try:
            mark_modified(self.repository, model)
            await self.client.service().RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name=model))
        except Exception as exc:
            log.error("%s: loading its model again failed (%s); an operator must load it", model, exc)
            return "error"
        log.warning("%s: model loaded again", model)
        return "success"

    async def _reload(self, ssm: str) -> None:
        log.error("SSM %s: its stub has died; loading its model again", ssm)
        self._set_ready(ssm, False, "its stub died")
        try:
            outcome = await self._load_again(ssm)
        finally:
            del self._reloading[ssm]
        self.tally.add("minions_ssm_reloads", 1, ssm=ssm, outcome=outcome)
        if outcome == "success":
            self._set_ready(ssm, True, "READY")
        await self._sweep_shm()

    async def _sweep_shm(self) -> None:
        """Remove the dead stub's shared memory, which neither it nor Triton frees, once tritonserver
        unmaps it as it unloads the old instance, about a second after the new one is ready. (For a
        decoupled model Triton 2.51 keeps the old instance, and region, while requests the dead stub
        never answered are pending; the server's stop path sweeps it then.)"""
        for delay_s in self.sweep_delays_s:
            await asyncio.sleep(delay_s)
            if sweep_orphaned_shm():
                break
