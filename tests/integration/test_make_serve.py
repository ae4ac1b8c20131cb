"""What `make serve` runs (python -m minions.deploy.server): tritonserver and, once it is ready, the
OpenAI frontend beside it; SIGTERM stops both cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys

import openai
import yaml

from minions.deploy.server import free_port, server_env
from minions.triton.shm import sweep_orphaned_shm
from tests.integration.helpers import http_ok, wait_until
from tests.support.triton_process import ROOT


def test_serve_runs_triton_and_the_openai_frontend_and_stops_both(tmp_path):
    raw = yaml.safe_load((ROOT / "deploy.yaml").read_text())
    raw["cache_dir"] = str(ROOT / raw["cache_dir"])
    ports = {name: free_port() for name in ("http_port", "grpc_port", "metrics_port", "openai_port")}
    raw["server"].update(ports)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(yaml.safe_dump(raw))
    build = tmp_path / "build"
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "minions.deploy.server", "--deploy", str(deploy), "--build",
                                 str(build)], env=server_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{ports['openai_port']}"
            wait_until(lambda: proc.poll() is not None or http_ok(f"{base}/health"),
                       timeout=300, what="the OpenAI frontend ready", interval=0.5)
            assert proc.poll() is None, log_path.read_text()[-3000:]
            api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
            answer = api.completions.create(model="minions", prompt="1, 2, 3,", max_tokens=4, temperature=0)
            assert answer.choices[0].text and answer.usage.completion_tokens == 4
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
    text = log_path.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "Fatal Python error" not in text, text[-3000:]
    for pattern in (str(build), f"minions.frontend.*--port={ports['openai_port']}"):
        left = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        assert not left, f"processes of this server left running ({pattern}): {left}"
    sweep_orphaned_shm(min_age_s=0.0)
