"""`make cluster`: N replicas of a deployment on this host, each on its own ports, behind the SGLang Model
Gateway with prefix affinity (gateway.py), until Ctrl-C stops all of it.

Each replica is `python -m minions.deploy.server` (tritonserver and the OpenAI frontend) with its own
build folder, so its model repository and stubs are its own, and ports offset by PORT_STRIDE per replica
from the deployment's. The gateway starts once every replica's /health answers 200 and routes the
OpenAI endpoints; Triton's KServe HTTP/gRPC ports are each replica's own (docs/deployments.md says what
goes in front of them). The host's cores are split between the replicas (each engine's `num_threads`:
cores / replicas, at least one), and with `--pin` each replica runs on cores of its own (taskset) where
the host has enough.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minions.deploy.config import ROOT, ServerPorts, load_or_exit
from minions.deploy.gateway import Affinity, gateway_command
from minions.deploy.render import orchestrator_settings
from minions.deploy.server import PORT_FLAGS, prepare, server_env, wait_http_ok

log = logging.getLogger("minions.cluster")

PORT_STRIDE = 10
"""Replica i listens on the deployment's ports + i * PORT_STRIDE (8000, 8010, ...)."""
GATEWAY_PORT = 9100
ANSWERED = re.compile(r"minions\.frontend: (\S+) /v1/\S+: ")
"""The frontend's log line for each request it ends (frontend/app.py `_Logged`): the answer's id."""
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


def replica_ports(base: ServerPorts, index: int) -> ServerPorts:
    shift = index * PORT_STRIDE
    return dataclasses.replace(base, http=base.http + shift, grpc=base.grpc + shift, metrics=base.metrics + shift,
                               openai=base.openai + shift)


def openai_url(ports: ServerPorts) -> str:
    return f"http://{ports.loopback_host}:{ports.openai}"


@dataclass
class Replica:
    index: int
    ports: ServerPorts
    build: Path
    proc: subprocess.Popen | None = None

    def command(self, deploy: Path, threads: int, pin: bool) -> list[str]:
        """`make serve` on this replica's ports and build folder, its engines on `threads` threads, and
        with `pin` on CPUs of its own (the index-th `threads` of them)."""
        first = self.index * threads
        cpus = [shutil.which("taskset") or "taskset", "-c", f"{first}-{first + threads - 1}"] if pin else []
        return [*cpus, sys.executable, "-m", "minions.deploy.server", f"--deploy={deploy}", f"--build={self.build}",
                f"--threads={threads}", *(f"--{port}-port={getattr(self.ports, port)}" for port in PORT_FLAGS)]

    def kill(self) -> None:
        """SIGKILL the whole replica: server, tritonserver, its stubs and frontend."""
        kill_group(self.proc)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` and every process of its group (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Cluster:
    """Replicas of `deploy` on `ports` (one ServerPorts each) behind the gateway on `gateway_port`:
    prefix affinity, or round-robin with `affinity=False` (the control). A context manager: entered
    once every replica and the gateway answer /health; left, everything is stopped."""

    def __init__(self, deploy: Path, ports: Sequence[ServerPorts], gateway_port: int, build_root: Path,
                 affinity: bool = True, pin: bool = False, log_dir: Path | None = None,
                 gateway_metrics_port: int | None = None) -> None:
        self.deploy = Path(deploy)
        self.dep = load_or_exit(self.deploy)
        self.affinity = Affinity.of(orchestrator_settings(self.dep)) if affinity else None
        self.replicas = [Replica(i, p, Path(build_root) / f"replica-{i}") for i, p in enumerate(ports)]
        self.gateway_port = gateway_port
        self.gateway_metrics_port = gateway_metrics_port or gateway_port + 1
        self.pin = pin
        self.log_dir = log_dir
        self.gateway: subprocess.Popen | None = None
        self._logs: list = []

    @property
    def url(self) -> str:
        """The gateway's OpenAI base URL."""
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    @property
    def workers(self) -> list[str]:
        """Each replica's OpenAI base URL (without /v1), as the gateway is given them."""
        return [openai_url(r.ports) for r in self.replicas]

    def served_by(self) -> dict[str, int]:
        """Which replica answered each request so far: its answer's id, found in that replica's frontend
        log (needs `log_dir`)."""
        served = {}
        for replica in self.replicas:
            text = (self.log_dir / f"replica-{replica.index}.log").read_text(errors="replace")
            served |= {answer: replica.index for answer in ANSWERED.findall(text)}
        return served

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        """`command` in a session of its own, its output in `log_dir`/<name>.log where given."""
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "w")
            self._logs.append(out)
        return subprocess.Popen(command, env=server_env(), stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True)

    @property
    def _processes(self) -> list[subprocess.Popen]:
        """The gateway, then each replica: those started."""
        return [p for p in (self.gateway, *(r.proc for r in self.replicas)) if p is not None]

    @property
    def threads(self) -> int:
        """Each replica's engine threads: the host's cores split between the replicas (one at least)."""
        return max(1, (os.cpu_count() or 1) // len(self.replicas))

    def __enter__(self) -> Cluster:
        # the model artifacts once, before replicas that would each convert them into the shared cache
        prepare(self.dep, self.replicas[0].build, self.replicas[0].ports)
        try:
            for replica in self.replicas:
                pin = self.pin and (replica.index + 1) * self.threads <= (os.cpu_count() or 1)
                replica.proc = self._start(f"replica-{replica.index}", replica.command(self.deploy, self.threads, pin))
            deadline = time.monotonic() + READY_TIMEOUT_S
            for replica in self.replicas:
                wait_http_ok(f"{openai_url(replica.ports)}/health", replica.proc, f"replica {replica.index}",
                             max(deadline - time.monotonic(), 1.0))
            self.gateway = self._start("gateway", gateway_command(sys.executable, self.gateway_port,
                                                                  workers=self.workers, affinity=self.affinity,
                                                                  metrics_port=self.gateway_metrics_port))
            wait_http_ok(f"http://127.0.0.1:{self.gateway_port}/health", self.gateway, "the gateway", 60.0)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def alive(self) -> bool:
        return all(p.poll() is None for p in self._processes)

    def stop(self) -> None:
        """The gateway, then each replica, as Ctrl-C stops `make serve` (SIGTERM), killed if it hangs."""
        for proc in self._processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._processes:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                kill_group(proc)
        for out in self._logs:
            out.close()

    def describe(self) -> str:
        policy = (f"prefix affinity (cache_aware, balance thresholds {self.affinity.abs_threshold} requests and "
                  f"{self.affinity.rel_threshold}x)" if self.affinity else "round-robin")
        lines = [f"gateway: {self.url} ({policy}); its metrics on :{self.gateway_metrics_port}",
                 f"{'replica':>7}  {'OpenAI':>22}  {'HTTP':>5}  {'gRPC':>5}  {'metrics':>7}"]
        lines += [f"{r.index:>7}  {openai_url(r.ports) + '/v1':>22}  {r.ports.http:>5}  {r.ports.grpc:>5}  "
                  f"{r.ports.metrics:>7}" for r in self.replicas]
        return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", default=os.environ.get("DEPLOY", str(ROOT / "deploy.yaml")))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--gateway-port", type=int, default=GATEWAY_PORT)
    parser.add_argument("--round-robin", action="store_true", help="no prefix affinity (to compare)")
    parser.add_argument("--pin", action="store_true", help="each replica on cores of its own (taskset)")
    parser.add_argument("--build", default=str(ROOT / "build" / "cluster"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    base = ServerPorts.of(load_or_exit(args.deploy))
    ports = [replica_ports(base, i) for i in range(args.replicas)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with Cluster(Path(args.deploy), ports, args.gateway_port, Path(args.build), affinity=not args.round_robin,
                     pin=args.pin) as cluster:
            print(cluster.describe(), flush=True)
            print("Ctrl-C stops the gateway and every replica.", flush=True)
            while cluster.alive():
                time.sleep(0.5)
            log.error("a replica or the gateway exited; stopping the cluster")
            sys.exit(1)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        raise SystemExit(f"minions.cluster: {exc}") from None


if __name__ == "__main__":
    main()
