"""An SSM's stub killed with SIGKILL in the middle of a request: the request ends, token-identical to
`off`, without waiting long on the dead SSM; the orchestrator loads the SSM's model again and uses it;
nothing is left cached or in /dev/shm.

Triton 2.51 neither restarts a dead stub nor marks its model not ready, so the orchestrator must:
its breaker opens on the dead stub's errors ("... is not healthy") and it reloads the model through
the repository API (explicit model control). Runs its own server (deploy.torch.yaml, whose ssm_q4 is
a llama.cpp model with a stub of its own), since it breaks one of its models on purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from client.api import GenerationParams, generate_grpc
from minions.triton.model_control import DEAD_STUB
from minions.triton.shm import mapped_shm_regions
from tests.integration.helpers import KillAfterChunk, metric_above, metric_value, serving_killed_stubs, wait_until
from harness.triton_process import ROOT, TritonProcess

PROMPT = "Explain in a few sentences why the sky is blue."
PARAMS = {"max_tokens": 64, "chat": True}
VICTIM = "ssm_q4"
DIED = f"SSM {VICTIM}: its stub has died; loading its model again"
"""What the orchestrator logs when it finds the victim's stub dead."""
SEEN_REGIONS: set[str] = set()
"""Every shared-memory region a stub of the module's server has held (killed stubs' included)."""


@pytest.fixture(scope="module")
def doomed_server(tmp_path_factory):
    with serving_killed_stubs(ROOT / "deploy.torch.yaml", tmp_path_factory.mktemp("triton-fault")) as proc:
        yield proc
    assert not _regions(proc), "shared memory left in /dev/shm after the server stopped"


def _regions(server: TritonProcess) -> set[str]:
    """/dev/shm regions of this server's stubs, live or dead."""
    return {p.name for p in Path("/dev/shm").glob("triton_python_backend_shm_region_*")} & SEEN_REGIONS


def _live_regions(server: TritonProcess) -> set[str]:
    stubs = server.stubs()
    SEEN_REGIONS.update(s.shm_region for s in stubs.values())
    return {s.shm_region for s in stubs.values()}


def _victim_pid(server: TritonProcess) -> int:
    stub = server.stubs().get(f"{VICTIM}_0_0")
    assert stub is not None, f"no stub for {VICTIM} in this server"
    return stub.pid


def _assert_clean(server: TritonProcess) -> None:
    """No sequence cached by any engine, and no region of this server's stubs orphaned in /dev/shm
    (every one is mapped by a live process: a killed stub's region is freed once tritonserver lets
    go of it; Triton 2.51 holds a dead decoupled stub's instance until it stops, docs/operations.md)."""
    for model in ("llm", VICTIM, "ssm_ngram"):
        # The live stub's own series: a killed stub's last values stay exported under its pid (docs/api.md).
        stub = str(server.stubs()[f"{model}_0_0"].pid)
        wait_until(lambda: metric_value(server.metrics_url, "minions_engine_cached_sequences", model=model,
                                        stub=stub) == 0, 20, f"{model} caching no sequence", interval=0.1)
    _live_regions(server)
    wait_until(lambda: not _regions(server) - mapped_shm_regions(), 20, "no orphaned region in /dev/shm", interval=0.2)


@pytest.fixture(scope="module")
def plain(doomed_server) -> str:
    return generate_grpc(doomed_server.grpc_url, "minions", PROMPT, GenerationParams(speculation="off", **PARAMS)).text


@pytest.mark.parametrize("speculation", ["vote", "bandit", f"single:{VICTIM}"])
def test_ssm_killed_mid_stream_then_reloaded(doomed_server, plain, speculation):
    server = doomed_server
    _assert_clean(server)
    victim = _victim_pid(server)
    reloads = metric_value(server.metrics_url, "minions_ssm_reloads", ssm=VICTIM, outcome="success")
    killer = KillAfterChunk(victim, 2)  # the first round is plain decoding; the second already drafted

    # A fixed draft length: every round asks the SSMs (an adaptive one may settle on s = 0 first).
    log_start = len(server.log_text())
    out = generate_grpc(server.grpc_url, "minions", PROMPT,
                        GenerationParams(speculation=speculation, num_draft_tokens=4, **PARAMS),
                        on_text=killer, timeout_s=60)
    kill = killer.join()
    assert kill.killed_at is not None and killer.arrivals[-1] > kill.killed_at, \
        "the request went on streaming after the kill"
    assert out.text == plain

    # A dead SSM costs failed calls, not waits: the request's calls to it after the kill (its drafts,
    # if it was asked, and its release at the end, which goes to every SSM of the mode) fail with the
    # dead stub's error; none waits out a timeout. The orchestrator's poll may find the dead stub
    # first: the SSM is then not ready, and a request that need not ask it (vote, bandit) calls it
    # no more.
    def victim_failures() -> list[str]:
        return [line for line in server.log_text()[log_start:].splitlines()
                if f"SSM {VICTIM} failed:" in line or f" in {VICTIM}: " in line]

    def noticed() -> bool:
        return bool(victim_failures()) or DIED in server.log_text()[log_start:]

    wait_until(noticed, 30, f"the dead {VICTIM} noticed (a failed call, or the poll)", interval=0.2)
    failures = victim_failures()
    assert all(DEAD_STUB in line for line in failures), f"failed otherwise than on the dead stub: {failures}"
    if speculation == f"single:{VICTIM}":  # every round asks it
        assert any(f"SSM {VICTIM} failed:" in line for line in failures), failures
    new_log = server.log_text()[log_start:]
    assert f"SSM {VICTIM} failed: no draft in" not in new_log and f"engine model {VICTIM} did not answer" not in new_log, \
        "a call to the dead SSM waited out a timeout"

    # The orchestrator notices the dead stub (its breaker opens) and loads the model again; requests
    # that ask the SSM meanwhile still decode exactly.
    single = GenerationParams(speculation=f"single:{VICTIM}", num_draft_tokens=4, **PARAMS)
    for _ in range(5):
        if metric_value(server.metrics_url, "minions_ssm_reloads", ssm=VICTIM, outcome="success") > reloads:
            break
        assert generate_grpc(server.grpc_url, "minions", PROMPT, single).text == plain
    assert metric_above(server.metrics_url, "minions_ssm_reloads", reloads, timeout=60, ssm=VICTIM,
                        outcome="success") > reloads, "the dead SSM's model was not loaded again"
    assert DIED in server.log_text()
    assert _victim_pid(server) != victim
    assert metric_above(server.metrics_url, "minions_ssm_ready", 0.0, timeout=10, ssm=VICTIM) == 1.0, \
        "the reloaded SSM is reported ready again"

    drafts = metric_value(server.metrics_url, "minions_ssm_drafts", ssm=VICTIM)
    assert generate_grpc(server.grpc_url, "minions", PROMPT, single).text == plain
    assert metric_above(server.metrics_url, "minions_ssm_drafts", drafts, ssm=VICTIM) > drafts, \
        "the reloaded SSM drafts again"
    _assert_clean(server)
