"""The lookup drafters answered in the orchestrator's process (deploy.yaml's default) or through their
Triton models (`lookups_in_process: false`): the same greedy output either way, and the suffix
drafter's passes are counted by the process that made them. The engine's own pass counter
(`minions_engine_batch_total{what="passes"}`, one series per stub) counts drafts only: the
orchestrator's model-control probes of the Triton model (a `stop` each poll) are not passes."""

from __future__ import annotations

import pytest

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import COPY_PROMPT, metric_above, metric_samples, metric_value, sole_stub

SUFFIX = "ssm_suffix"


def passes(server, stub: int) -> float:
    return metric_value(server.metrics_url, "minions_engine_batch_total", model=SUFFIX, what="passes", stub=str(stub))


@pytest.mark.parametrize("where", ["in_process", "triton"])
def test_lookups_draft_the_same_from_either_place_and_each_place_counts_its_own(server, triton_lookups_server,
                                                                                 where):
    served = server if where == "in_process" else triton_lookups_server
    orchestrator, model = sole_stub(served, "minions_0_0").pid, sole_stub(served, f"{SUFFIX}_0_0").pid
    drafting, idle = (orchestrator, model) if where == "in_process" else (model, orchestrator)
    params = dict(max_tokens=32, chat=True)
    plain = generate_grpc(served.grpc_url, "minions", COPY_PROMPT, GenerationParams(speculation="off", **params))
    before, idle_before = passes(served, drafting), passes(served, idle)
    spec = generate_grpc(served.grpc_url, "minions", COPY_PROMPT,
                         GenerationParams(speculation="single:ssm_suffix", num_draft_tokens=4,
                                          return_perf_metrics=True, **params))
    assert spec.text == plain.text
    assert spec.total_draft_tokens > 0
    assert metric_above(served.metrics_url, "minions_engine_batch_total", before, timeout=20, model=SUFFIX,
                        what="passes", stub=str(drafting)) > before, f"no suffix draft counted in the {where} stub"
    assert passes(served, idle) == idle_before, "the other process drafted too"
    if where == "triton":
        assert not metric_samples(served.metrics_url, "minions_engine_batch_total", model=SUFFIX,
                                  stub=str(orchestrator)), "the orchestrator built a lookup it does not ask"
