"""minions.triton.model_control.ModelControl.poll: a model that Triton calls READY with no live stub process
has died and is loaded again, unless Triton no longer calls it READY once the stubs were looked at (an
operator's unload ends the stub between the index read and the look at /proc); a model loaded again or
not ready has its streams retired, so that Triton can unload the old instance; a new engine model found
READY joins as an SSM, Minions' own or TensorRT-LLM's, and no other model does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.serving.metric_tally import MetricTally
from minions.speculation.services import Services
from minions.triton.model_control import ModelControl


class _Repository:
    """Triton's repository service: each RepositoryIndex call answers the next of `indexes`
    ({model: state}), the last one from then on; loads are recorded."""

    def __init__(self, *indexes: dict[str, str], configs: dict[str, SimpleNamespace] | None = None) -> None:
        self.indexes = list(indexes)
        self.loads: list[str] = []
        self.configs = configs or {}

    async def RepositoryIndex(self, request):
        states = self.indexes.pop(0) if len(self.indexes) > 1 else self.indexes[0]
        return SimpleNamespace(models=[SimpleNamespace(name=n, state=s, reason="") for n, s in states.items()])

    async def RepositoryModelLoad(self, request):
        self.loads.append(request.model_name)

    async def ModelConfig(self, request):
        return SimpleNamespace(config=self.configs[request.name])


class _Client:
    native_models: frozenset[str] = frozenset()

    def __init__(self, repository: _Repository) -> None:
        self.repository = repository
        self.failed: list[str] = []
        self.retired: list[str] = []
        self.probed: list[str] = []

    def service(self) -> _Repository:
        return self.repository

    def fail_model(self, model: str, error: Exception) -> None:
        self.failed.append(model)

    def retire_streams(self, model: str) -> None:
        self.retired.append(model)

    async def generate(self, model: str, request: EngineRequest) -> EngineResult:
        """A live stub's answer to the model-control probe (a `stop`): at once, empty."""
        self.probed.append(model)
        return EngineResult([])


async def _poll(tmp_path, *indexes: dict[str, str]) -> _Client:
    """One poll of a repository in `tmp_path` (where no stub process runs), then the reloads it began."""
    client = _Client(_Repository(*indexes))
    control = ModelControl(client, tmp_path, Services(ssms=("ssm",)), MetricTally(), 1.0, reload=True,
                           sweep_delays_s=())
    await control.poll()
    await asyncio.gather(*control._reloading.values())
    return client


def test_a_ready_model_without_a_live_stub_is_loaded_again(tmp_path):
    client = asyncio.run(_poll(tmp_path, {"llm": "READY", "ssm": "READY"}))
    assert sorted(client.failed) == ["llm", "ssm"]
    assert sorted(client.repository.loads) == ["llm", "ssm"]


def test_a_model_unloaded_while_its_stubs_were_looked_at_is_not_reloaded(tmp_path):
    client = asyncio.run(_poll(tmp_path, {"llm": "READY", "ssm": "READY"},
                               {"llm": "READY", "ssm": "UNLOADING"}))
    assert client.failed == ["llm"]
    assert client.repository.loads == ["llm"]


def _config(backend: str, decoupled: bool, **parameters: str) -> SimpleNamespace:
    return SimpleNamespace(backend=backend, parameters=parameters,
                           model_transaction_policy=SimpleNamespace(decoupled=decoupled))


def test_a_new_engine_model_joins_as_an_ssm_tensorrt_llm_s_own_as_a_native_one(tmp_path):
    """As the orchestrator's join does, the test's adds the SSM to the services and a native one to the
    client's native models; the native SSM, which has no Python stub, is then not taken for dead."""
    repository = _Repository({"llm": "READY", "trt_draft": "READY", "ssm_new": "READY", "preprocessing": "READY"},
                             configs={"trt_draft": _config("tensorrtllm", True),
                                      "ssm_new": _config("python", True, engine="ngram"),
                                      "preprocessing": _config("python", False)})
    client = _Client(repository)
    services = Services(ssms=())
    joined = []

    def on_join(name: str, decoupled: bool, native: bool) -> None:
        joined.append((name, decoupled, native))
        services.add_ssm(name)
        if native:
            client.native_models = client.native_models | {name}

    control = ModelControl(client, tmp_path, services, MetricTally(), 1.0, reload=True, on_join=on_join,
                           sweep_delays_s=())

    async def poll_twice():
        for _ in range(2):
            await control.poll()
            await asyncio.gather(*control._reloading.values())

    asyncio.run(poll_twice())
    assert joined == [("trt_draft", True, True), ("ssm_new", True, False)]
    assert services.ssms == ("trt_draft", "ssm_new")
    assert "trt_draft" not in client.failed and "trt_draft" not in repository.loads
    assert "ssm_new" in repository.loads, "a Python engine model with no live stub is loaded again"


def test_the_streams_to_a_reloaded_or_unready_model_are_retired(tmp_path):
    """Polls of an LLM whose stub is replaced (an operator's load: old and new live together, then the
    new alone) and of an SSM that an operator unloads; probes answer at once."""
    llm = [{1}, {1}, {1, 2}, {2}, {2}]
    ssm = [{5}, {5}, {5}, set(), set()]
    states = [{"llm": "READY", "ssm": s} for s in ("READY", "READY", "READY", "UNLOADING", "UNAVAILABLE")]
    polls = iter(zip(llm, ssm))

    def live_stubs(repository):
        pids = next(polls)
        return {"llm": list(pids[0]), "ssm": list(pids[1])}

    client = _Client(_Repository(*states))
    control = ModelControl(client, tmp_path, Services(ssms=("ssm",)), MetricTally(), 1.0, reload=True,
                           stubs=live_stubs)

    retired_by_poll = []

    async def poll_all():
        for _ in llm:
            await control.poll()
            retired_by_poll.append(sorted(client.retired))
            client.retired.clear()

    asyncio.run(poll_all())
    assert retired_by_poll == [[], [], ["llm"], ["llm", "ssm"], ["ssm"]]
    assert "llm" in client.probed and "ssm" in client.probed, "the live stubs were probed"
    assert client.failed == [] and client.repository.loads == []
