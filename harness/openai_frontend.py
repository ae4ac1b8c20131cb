"""The OpenAI frontend beside a tritonserver that a test or a benchmark started, as `make serve` starts
it: Triton's gRPC address and the model repository, so that it also ends the generations a dead
orchestrator stub leaves unanswered (minions/frontend/orphans.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

from minions.deploy.server import free_port, frontend_command, server_env, wait_http_ok
from harness.triton_process import TritonProcess, stop_process

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class FrontendStopError(RuntimeError):
    """The frontend did not stop cleanly on SIGTERM, or logged a traceback."""


@contextlib.contextmanager
def openai_frontend(triton: TritonProcess, log_path: Path | None = None, model: str = "minions",
                    env: Mapping[str, str] | None = None) -> Iterator[str]:
    """The frontend for `model` of `triton` on a free port, its output in `log_path` (default: beside
    the server's log), yielded as its /v1 URL once /health answers. Its environment is `make serve`'s
    with `env` added; an API key only from `env`, so that one in the caller's environment does not
    lock the caller out. Stopped with SIGTERM after; leaving the block normally, it must have stopped
    cleanly and logged no traceback (FrontendStopError)."""
    port = free_port()
    log_path = log_path or triton.log_path.with_name(f"frontend-{port}.log")
    command = frontend_command(dataclasses.replace(triton.ports, openai=port), model, triton.build / "model_repository")
    keyless = {name: value for name, value in server_env().items() if not name.startswith("MINIONS_API_KEY")}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env={**keyless, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/health", proc, "the OpenAI frontend", READY_TIMEOUT_S)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            stop_process(proc, signal.SIGTERM, STOP_TIMEOUT_S)
    output = log_path.read_text(errors="replace")
    # uvicorn shuts down gracefully on SIGTERM, then exits by the signal it caught
    if proc.returncode not in (0, -signal.SIGTERM) or "Traceback" in output:
        raise FrontendStopError(f"the OpenAI frontend did not stop cleanly (exit {proc.returncode}), "
                                f"{log_path}:\n{output[-3000:]}")
