"""What `make serve` runs (python -m minions.deploy.server): tritonserver and, once it is ready, the
OpenAI frontend beside it; SIGTERM stops both cleanly; a dead orchestrator stub is loaded again, and
the OpenAI generations it was serving end with 503 instead of hanging."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import yaml

from minions.deploy.server import EXTRA_ARGS_ENV, free_ports, server_env
from minions.triton.stubs import live_stub_pids
from minions.triton.shm import sweep_orphaned_shm
from tests.integration.helpers import StubKill, http_ok, wait_until
from harness.triton_process import KILLED_STUBS_EXIT_TIMEOUT, ROOT


EXIT_TIMEOUT = "Exit timeout expired"
"""tritonserver's log line when a stop waited out its exit timeout for requests no stub will answer."""


@contextlib.contextmanager
def _serving(tmp_path: Path, orphaned: bool = False):
    """`python -m minions.deploy.server` on free ports until the OpenAI frontend answers; yields the
    process, the frontend's base URL and the build folder, then stops it with SIGTERM and checks that
    it exited cleanly and left nothing running. With `orphaned`, requests a killed stub never answered
    are still held in Triton (2.51): the stop then waits out Triton's exit timeout and exits with 1."""
    raw = yaml.safe_load((ROOT / "deploy.yaml").read_text())
    raw["cache_dir"] = str(ROOT / raw["cache_dir"])
    ports = dict(zip(("http_port", "grpc_port", "metrics_port", "openai_port"), free_ports(4)))
    raw["server"].update(ports)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(yaml.safe_dump(raw))
    build = tmp_path / "build"
    log_path = tmp_path / "serve.log"
    env = {**server_env(), **({EXTRA_ARGS_ENV: " ".join(KILLED_STUBS_EXIT_TIMEOUT)} if orphaned else {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "minions.deploy.server", "--deploy", str(deploy), "--build",
                                 str(build)], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{ports['openai_port']}"
            wait_until(lambda: proc.poll() is not None or http_ok(f"{base}/health"),
                       timeout=300, what="the OpenAI frontend ready", interval=0.5)
            assert proc.poll() is None, log_path.read_text()[-3000:]
            yield proc, base, build, log_path
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
    text = log_path.read_text(errors="replace")
    assert code == 0 or orphaned and code == 1 and EXIT_TIMEOUT in text, text[-3000:]
    assert "Fatal Python error" not in text, text[-3000:]
    for pattern in (str(build), f"minions.frontend.*--port={ports['openai_port']}"):
        left = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        assert not left, f"processes of this server left running ({pattern}): {left}"
    sweep_orphaned_shm(min_age_s=0.0)


def _completion(base: str) -> str:
    api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    answer = api.completions.create(model="minions", prompt="1, 2, 3,", max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens == 4
    return answer.choices[0].text


def test_serve_runs_triton_and_the_openai_frontend_and_stops_both(tmp_path):
    with _serving(tmp_path) as (_, base, _, _):
        assert _completion(base)


def test_serve_loads_the_orchestrator_again_when_its_stub_dies(tmp_path):
    with _serving(tmp_path) as (_, base, build, log_path):
        before = _completion(base)
        model_dir = build / "model_repository" / "minions"
        [victim] = live_stub_pids(model_dir)
        StubKill(victim).join()
        wait_until(lambda: "minions: model loaded again" in log_path.read_text(errors="replace"), 60,
                   "the orchestrator's model loaded again", interval=0.2)
        assert "minions: its stub has died" in log_path.read_text(errors="replace")
        [new] = live_stub_pids(model_dir)
        assert new != victim
        assert _completion(base) == before


def test_an_openai_generation_under_way_when_the_orchestrator_dies_ends_with_503(tmp_path):
    """Triton 2.51 never answers the requests a killed `minions` stub was serving; the frontend sees the
    stub gone (frontend/orphans.py) and ends its generation with the error event of a 503, where the
    client used to wait out its own deadline. Fails without the watch: the read times out instead."""
    with _serving(tmp_path, orphaned=True) as (_, base, build, log_path):
        [victim] = live_stub_pids(build / "model_repository" / "minions")
        api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        stream = api.completions.create(model="minions", prompt="Count: 1, 2, 3,", max_tokens=1000,
                                        temperature=0, stream=True, extra_body={"min_tokens": 1000})
        assert next(stream).choices  # under way
        kill = StubKill(victim)
        with pytest.raises(openai.APIError) as ended:
            for _ in stream:
                pass
        kill.join()
        assert "orchestrator's process died" in str(ended.value)
        wait_until(lambda: "minions: model loaded again" in log_path.read_text(errors="replace"), 60,
                   "the orchestrator's model loaded again", interval=0.2)
        assert _completion(base)  # the next request is served
