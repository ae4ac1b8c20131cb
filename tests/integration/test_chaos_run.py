"""`make chaos` in a short form: the chaos tool's own run (benchmarks/chaos/) on a fresh server of its
own, under load until it has met each fault once and served every protocol and mode (`--cover`: ended
by what it met, not by the clock, so a slow machine makes it longer, not weaker), with the faults that
are recovered today: an SSM's stub killed with SIGKILL (the orchestrator loads its model again) and a
reload of each model through the repository API. Nothing
hangs or crashes, every request is served, refused or failed with an error message (over gRPC, HTTP
and the OpenAI frontend, each of which serves some), and no shared memory is leaked.

The orchestrator finds a killed SSM stub by its model-control probe each poll and loads the model
again (docs/operations.md "Chaos"); a killed SSM not loaded again in --recovery-s is a problem of the
run, as is every other problem the tool reports, and fails the test. How slow a request may be is
`make chaos`'s to judge on a quiet machine: here `--slow-s` is far above what a busy core makes of a
32-token request (62 s and a first request 98 s after a reload, measured with the second core held),
so that only what must never happen fails the test."""

from __future__ import annotations

import json

from benchmarks.chaos.run import main
from benchmarks.chaos.verdict import FAILED, HUNG, INCOMPLETE, MODES, PROTOCOLS, REFUSED, SERVED


def test_a_short_chaos_run_with_ssm_kills_and_reloads(tmp_path, nothing_beside):
    rc = main(["--minutes", "0.5", "--cover", "--max-minutes", "15", "--seed", "1", "--faults", "ssm_kill,reload",
               "--min-gap-s", "3", "--max-gap-s", "6", "--users", "3", "--max-tokens", "32", "--hang-s", "120",
               "--slow-s", "600",
               "--recovery-s", "60", "--exit-timeout-s", "5", "--out", str(tmp_path)])

    [path] = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    print((tmp_path / path.name.replace(".json", ".txt")).read_text())
    outcomes, requests = report["requests"]["outcomes"], report["requests"]
    assert outcomes[HUNG] == 0 and outcomes[INCOMPLETE] == 0, requests["examples"]
    assert outcomes[SERVED] > 0
    assert all(report["requests"]["by_mode"][f"{protocol} {mode}"].get(SERVED) for protocol in PROTOCOLS
               for mode in MODES), report["requests"]["by_mode"]
    assert outcomes[SERVED] + outcomes[REFUSED] + outcomes[FAILED] == requests["total"]
    assert report["server"]["exited_during_run"] is None and report["server"]["crash_lines"] == []
    assert report["shm"]["leaked"] == [] and report["shm"]["left_after_stop"] == []
    assert report["faults_by_kind"].get("ssm_kill", 0) >= 1 and report["faults_by_kind"].get("reload", 0) >= 1
    reloads = [f for f in report["faults"] if f["kind"] == "reload"]
    assert all(f["recovered_s"] is not None and f["error"] is None for f in reloads), reloads
    assert report["problems"] == [], report["problems"]  # every killed SSM loaded again in time, too
    assert rc == 0
