"""The OpenAI frontend beside a tritonserver that a benchmark or a test started, as `make serve` starts
it: Triton's gRPC address and the model repository, so that it also ends the generations a dead
orchestrator stub leaves unanswered (minions/frontend/orphans.py)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from minions.deploy.server import free_port, frontend_command, server_env, wait_http_ok
from tests.support.triton_process import TritonProcess, stop_process

READY_TIMEOUT_S = 60.0


@contextlib.contextmanager
def openai_frontend(triton: TritonProcess, log_path: Path, model: str) -> Iterator[str]:
    """The frontend for `model` of `triton` on a free port, its output in `log_path`: its /v1 URL once
    /health answers; stopped with SIGTERM after."""
    port = free_port()
    command = frontend_command(triton.grpc_url, "127.0.0.1", port, model, triton.build / "model_repository")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/health", proc, "the OpenAI frontend", READY_TIMEOUT_S)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            stop_process(proc, signal.SIGTERM, 30)
