"""What the OpenAI port's /health decides from (frontend/health.py): Triton's readiness of the
orchestrator and its LLM, the orchestrator's live stub, and that stub's own `minions_llm_ready` gauge,
never a gauge a dead stub left behind. Triton is a stand-in here; tests/integration/test_llm_fault.py
reads the real /health while the LLM is unloaded and after its stub is killed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from minions.frontend.health import LLM_READY_GAUGE, ReplicaHealth, gauge_of_stubs

METRICS = f"""# HELP {LLM_READY_GAUGE} 1 while the LLM's model is ready
# TYPE {LLM_READY_GAUGE} gauge
{LLM_READY_GAUGE}{{model="minions",stub="101"}} 0
{LLM_READY_GAUGE}{{model="minions",stub="202"}} 1
minions_num_requests_running{{model="minions",stub="202"}} 3
"""


class Triton:
    """Triton's answers: which models are ready, and the orchestrator's LLM."""

    model = "minions"

    def __init__(self, ready: set[str]) -> None:
        self.ready_models = ready

    async def ready(self, model: str) -> bool:
        return model in self.ready_models

    async def llm_model(self) -> str:
        return "llm"


def unavailable(ready: set[str], stubs: list[int] | None = None, metrics: str = METRICS) -> str | None:
    health = ReplicaHealth(Triton(ready), Path("/repo") if stubs is not None else None, "http://metrics",
                           fetch=lambda url: metrics, stubs=lambda model_dir: stubs or [])
    return asyncio.run(health.unavailable())


def test_the_gauge_is_read_from_the_live_stubs_series_only():
    assert gauge_of_stubs(METRICS, LLM_READY_GAUGE, [202]) == [1.0]
    assert gauge_of_stubs(METRICS, LLM_READY_GAUGE, [101]) == [0.0]
    assert gauge_of_stubs(METRICS, LLM_READY_GAUGE, [303]) == []


def test_serving_needs_the_orchestrator_and_the_llm_ready():
    assert "orchestrator model 'minions' is not ready" in unavailable({"llm"})
    assert "LLM model 'llm' is not ready" in unavailable({"minions"})
    assert unavailable({"minions", "llm"}) is None  # no repository on this host: Triton's word only


def test_with_the_repository_it_needs_a_live_stub_that_says_its_llm_serves():
    both = {"minions", "llm"}
    assert unavailable(both, stubs=[202]) is None
    assert "no live stub" in unavailable(both, stubs=[])
    assert "refuses requests" in unavailable(both, stubs=[101])  # the live stub reports 0
    assert "not yet reported" in unavailable(both, stubs=[303])  # a new stub before its first export


def test_each_change_is_logged_once(caplog):
    triton = Triton({"minions", "llm"})
    health = ReplicaHealth(triton)
    caplog.set_level("INFO", logger="minions.frontend")

    async def checks():
        for ready in ({"minions", "llm"}, {"minions"}, {"minions"}, {"minions", "llm"}, {"minions", "llm"}):
            triton.ready_models = ready
            await health.check()

    asyncio.run(checks())
    assert [r.getMessage() for r in caplog.records] == [
        "health: not serving: the LLM model 'llm' is not ready", "health: serving"]
