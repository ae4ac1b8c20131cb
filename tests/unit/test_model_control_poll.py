"""minions.triton.model_control.ModelControl.poll: a model that Triton calls READY with no live stub process
has died and is loaded again, unless Triton no longer calls it READY once the stubs were looked at (an
operator's unload ends the stub between the index read and the look at /proc)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from minions.serving.metric_tally import MetricTally
from minions.speculation.services import Services
from minions.triton import model_control
from minions.triton.model_control import ModelControl


class _Repository:
    """Triton's repository service: each RepositoryIndex call answers the next of `indexes`
    ({model: state}), the last one from then on; loads are recorded."""

    def __init__(self, *indexes: dict[str, str]) -> None:
        self.indexes = list(indexes)
        self.loads: list[str] = []

    async def RepositoryIndex(self, request):
        states = self.indexes.pop(0) if len(self.indexes) > 1 else self.indexes[0]
        return SimpleNamespace(models=[SimpleNamespace(name=n, state=s, reason="") for n, s in states.items()])

    async def RepositoryModelLoad(self, request):
        self.loads.append(request.model_name)


class _Client:
    native_models: frozenset[str] = frozenset()

    def __init__(self, repository: _Repository) -> None:
        self.repository = repository
        self.failed: list[str] = []

    def service(self) -> _Repository:
        return self.repository

    def fail_model(self, model: str, error: Exception) -> None:
        self.failed.append(model)


async def _poll(tmp_path, monkeypatch, *indexes: dict[str, str]) -> _Client:
    """One poll of a repository in `tmp_path` (where no stub process runs), then the reloads it began."""
    monkeypatch.setattr(model_control, "SWEEP_DELAYS_S", ())
    client = _Client(_Repository(*indexes))
    control = ModelControl(client, tmp_path, Services(ssms=("ssm",), llm="llm"), MetricTally(), 1.0, reload=True)
    await control.poll()
    await asyncio.gather(*control._reloading.values())
    return client


def test_a_ready_model_without_a_live_stub_is_loaded_again(tmp_path, monkeypatch):
    client = asyncio.run(_poll(tmp_path, monkeypatch, {"llm": "READY", "ssm": "READY"}))
    assert sorted(client.failed) == ["llm", "ssm"]
    assert sorted(client.repository.loads) == ["llm", "ssm"]


def test_a_model_unloaded_while_its_stubs_were_looked_at_is_not_reloaded(tmp_path, monkeypatch):
    client = asyncio.run(_poll(tmp_path, monkeypatch, {"llm": "READY", "ssm": "READY"},
                               {"llm": "READY", "ssm": "UNLOADING"}))
    assert client.failed == ["llm"]
    assert client.repository.loads == ["llm"]
