"""Start the real tritonserver (from the nvidia-pytriton wheel) on a rendered model repository.

`python -m minions.deploy.server` renders build/model_repository from deploy.yaml and runs tritonserver in
the foreground. The Python-backend stub imports from the Python whose bin/ is first on PATH and links
Debian's libpython3.11, so this must run from the project's venv made with /usr/bin/python3.11.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from minions.deploy.artifacts import gguf_for
from minions.deploy.config import ROOT, Deployment, ServerPorts, load_or_exit
from minions.deploy.llama_probe import LlamaBuildError, check_runs
from minions.deploy.render import render_repository
from minions.deploy.watchdog import WATCH_INTERVAL_S, StubWatchdog
from minions.settings import EngineKind
from minions.triton.shm import sweep_orphaned_shm

log = logging.getLogger("minions.server")


TRITON_HOME_ENV = "MINIONS_TRITON_HOME"
"""Where tritonserver lives (bin/, backends/), when not the nvidia-pytriton wheel's: deploy.yaml's
`server.triton_home` sets it, e.g. /opt/tritonserver in NVIDIA's Triton containers."""


EXTRA_ARGS_ENV = "MINIONS_TRITON_ARGS"
"""More tritonserver options, appended to the command line as a shell would split them."""


PORT_FLAGS = ("http", "grpc", "metrics", "openai")
"""The ports `--<name>-port` sets, by their ServerPorts field."""


THREADED_ENGINES = (EngineKind.LLAMACPP, EngineKind.TORCH, EngineKind.DISTILLED)


def set_threads(dep: Deployment, threads: int) -> None:
    """Every compute engine of `dep` on `threads` threads: replicas that share a host split its cores, as
    llama.cpp's spinning threads slow each other down many times over on shared cores (docs/engines.md)."""
    if threads < 1:
        raise SystemExit(f"--threads must be at least 1, got {threads}")
    for model in (dep.llm, *dep.ssms):
        if model["engine"] in THREADED_ENGINES:
            model["num_threads"] = threads


def triton_home() -> Path:
    """The tritonserver installation: $MINIONS_TRITON_HOME, else the one inside the nvidia-pytriton wheel."""
    if os.environ.get(TRITON_HOME_ENV):
        return Path(os.environ[TRITON_HOME_ENV])
    import pytriton

    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def prepare_backend_dir(build: Path) -> Path:
    """The backend directory: an installation's own where its Python backend has its stub (Triton's
    containers, with the tensorrtllm backend beside it); else, for the wheel, backends/python under
    `build` with libtriton_python.so, its utils and the stub for this Python side by side."""
    home = triton_home()
    if (home / "backends" / "python" / "triton_python_backend_stub").exists():
        return home / "backends"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = build / "backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    for src in [
        home / "backends" / "python" / "libtriton_python.so",
        home / "backends" / "python" / "triton_python_backend_utils.py",
        home / "python_backend_stubs" / py / "triton_python_backend_stub",
    ]:
        dst = target / src.name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            shutil.copy2(src, dst)
    return build / "backends"


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free now: each socket stays bound until all are picked (ports asked one
    at a time can come back twice, once the first socket is closed)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]


def repository_models(repo: Path) -> list[str]:
    """The models of a rendered repository (folders with a config.pbtxt)."""
    return sorted(d.name for d in repo.iterdir() if (d / "config.pbtxt").is_file())


def server_command(repo: Path, backends: Path, ports: ServerPorts, log_verbose: int = 0,
                   triton_args: Sequence[str] = ()) -> list[str]:
    """tritonserver's command line: explicit model control with every model of the repository loaded
    at start, so operators load and unload models through the repository API (docs/operations.md);
    then `triton_args` and $MINIONS_TRITON_ARGS, tritonserver's own options."""
    return [
        str(triton_home() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends}",
        f"--cache-directory={triton_home() / 'caches'}",
        "--model-control-mode=explicit",
        *(f"--load-model={name}" for name in repository_models(repo)),
        f"--http-address={ports.host}",
        f"--http-port={ports.http}",
        f"--grpc-address={ports.host}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={ports.host}",
        f"--metrics-port={ports.metrics}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        "--exit-on-error=true",
        "--strict-readiness=true",
        f"--log-verbose={log_verbose}",
        # logits and long prompts cross the stub boundary through shared memory: start big enough
        "--backend-config=python,shm-default-byte-size=16777216",
        "--backend-config=python,shm-growth-byte-size=16777216",
        *triton_args,
        *shlex.split(os.environ.get(EXTRA_ARGS_ENV, "")),
    ]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    site = Path(triton_home()).parent.parent
    libs = [str(p) for p in (site / "nvidia_pytriton.libs", triton_home() / "lib") if p.is_dir()]
    env["LD_LIBRARY_PATH"] = ":".join(libs + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p])
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    paths = [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env["PYTHONPATH"] = ":".join([str(ROOT / "python_backend"), *paths])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Engines pick their own thread counts (deploy.yaml num_threads); keep the orchestrator from spawning pools.
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def prepare(dep: Deployment, build: Path, ports: ServerPorts) -> tuple[Path, Path]:
    """Render the repository and the backend directory; first check that llama.cpp runs each of the
    deployment's GGUFs on this machine (llama_probe.py: a stub killed by SIGILL says nothing useful)."""
    for model in [dep.llm, *dep.ssms]:
        if model["engine"] == EngineKind.LLAMACPP:
            check_runs(gguf_for(model["source"], dep, model.get("repack")), dep.cache_dir)
    repo = render_repository(dep, build / "model_repository", ports.loopback_grpc_url)
    return repo, prepare_backend_dir(build)


def start_server(dep: Deployment, ports: ServerPorts, build: Path, stdout=None, log_verbose: int = 0,
                 edit: Callable[[Path], None] | None = None, triton_args: Sequence[str] = ()) -> subprocess.Popen:
    """Render the repository, let `edit` change it (tests), and start tritonserver on it, with
    `triton_args` added to its command line."""
    repo, backends = prepare(dep, build, ports)
    if edit is not None:
        edit(repo)
    cmd = server_command(repo, backends, ports=ports, log_verbose=log_verbose, triton_args=triton_args)
    log.info("starting: %s", " ".join(cmd))
    return subprocess.Popen(cmd, env=server_env(), stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                            start_new_session=True)


def wait_ready(ports: ServerPorts, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Wait until tritonserver says it is ready and its metrics endpoint answers: it starts that
    endpoint last, tens of ms after HTTP says ready, and a caller that reads metrics at once (a
    benchmark's first cell) was refused."""
    deadline = time.monotonic() + timeout
    for url in (f"http://{ports.host}:{ports.http}/v2/health/ready", f"http://{ports.host}:{ports.metrics}/metrics"):
        wait_http_ok(url, proc, "tritonserver", max(deadline - time.monotonic(), 0.0))


def wait_http_ok(url: str, proc: subprocess.Popen, what: str, timeout: float) -> None:
    """Poll `url` until it answers 200 (a server's health); fail when `proc`, the server `what`, exits
    first or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:  # refused while starting, 503 while loading
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def frontend_command(ports: ServerPorts, model: str, repository: Path | None = None) -> list[str]:
    """The OpenAI-compatible frontend's command line (python -m minions.frontend) for tritonserver on
    `ports`; with the model repository, it ends the generations a dead orchestrator stub leaves
    unanswered, and its /health follows the orchestrator's stub and its view of the LLM."""
    local = [f"--model-repository={repository}", f"--metrics-url={ports.loopback_metrics_url}"] if repository else []
    return [sys.executable, "-m", "minions.frontend", f"--grpc-url={ports.loopback_grpc_url}", f"--host={ports.host}",
            f"--port={ports.openai}", f"--model={model}", *local]


def serve(cmd: list[str], ports: ServerPorts, model: str, repository: Path) -> int:
    """Run tritonserver and, once it is ready, the OpenAI frontend beside it, until either exits or
    this process is told to stop (Ctrl-C, SIGTERM); then stop both. Meanwhile the orchestrator `model`
    is loaded again should its stub die (watchdog.py). Returns tritonserver's exit code, or 1 when the
    frontend failed on its own (e.g. its port was taken)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop as on Ctrl-C: through the finally below
    triton = subprocess.Popen(cmd, env=server_env())
    frontend, failed = None, False
    try:
        wait_ready(ports, triton, timeout=3600)
        if ports.openai:
            frontend = subprocess.Popen(frontend_command(ports, model, repository), env=server_env())
        watchdog, watched_at = StubWatchdog(repository, model, ports.loopback_grpc_url), time.monotonic()
        while triton.poll() is None and (frontend is None or frontend.poll() is None):
            time.sleep(0.5)
            if time.monotonic() - watched_at >= WATCH_INTERVAL_S:
                watched_at = time.monotonic()
                try:
                    watchdog.check()
                except Exception as exc:  # tritonserver is busy loading or stopping: the next look tries again
                    log.debug("watchdog: %s", exc)
        if frontend is not None and frontend.poll() is not None:
            log.error("the OpenAI frontend exited with code %d; stopping tritonserver", frontend.returncode)
            failed = True
    except KeyboardInterrupt:
        pass
    finally:
        for proc, sig in ((frontend, signal.SIGTERM), (triton, signal.SIGINT)):
            if proc is not None and proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    code = triton.wait()
    sweep_orphaned_shm()  # killed stubs' regions, which tritonserver held until it exited
    return 1 if failed else code


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the Minions deployment with tritonserver")
    parser.add_argument("--deploy", default=os.environ.get("DEPLOY", str(ROOT / "deploy.yaml")))
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--prepare-only", action="store_true", help="render the repository and exit")
    for port in PORT_FLAGS:
        parser.add_argument(f"--{port}-port", type=int, default=None,
                            help=f"the {port} port instead of the deployment's (several replicas on one host)")
    parser.add_argument("--threads", type=int, default=None,
                        help="every engine's num_threads instead of the deployment's (replicas sharing a host's cores)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dep = load_or_exit(args.deploy)
    if args.threads is not None:
        set_threads(dep, args.threads)
    if dep.server.get("triton_home"):
        os.environ[TRITON_HOME_ENV] = str(dep.server["triton_home"])
    build = Path(args.build)
    ports = dataclasses.replace(ServerPorts.of(dep), **{port: number for port in PORT_FLAGS
                                                         if (number := getattr(args, f"{port}_port")) is not None})
    try:
        repo, backends = prepare(dep, build, ports)
    except LlamaBuildError as exc:
        raise SystemExit(f"{dep.path}: {exc}") from None
    if args.prepare_only:
        print(repo)
        return
    cmd = server_command(repo, backends, ports, int(dep.server.get("log_verbose", 0)))
    sweep_orphaned_shm()  # an earlier server's killed stubs
    log.info("HTTP %s:%d, gRPC %s:%d, metrics %s:%d, OpenAI %s", ports.host, ports.http, ports.host, ports.grpc,
             ports.host, ports.metrics, f"http://{ports.host}:{ports.openai}/v1" if ports.openai else "off")
    sys.exit(serve(cmd, ports, dep.orchestrator_name, repo))


if __name__ == "__main__":
    main()
