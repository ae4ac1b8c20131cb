"""`make cluster`'s plan, before any process starts: each replica's ports, threads, cores and command
line, and the gateway's (minions/deploy/cluster.py, gateway.py). tests/integration/test_cluster.py runs it."""

from __future__ import annotations

from pathlib import Path

from minions.deploy.cluster import Replica, replica_ports
from minions.deploy.config import ServerPorts, load_deployment
from minions.deploy.gateway import Affinity, gateway_command
from minions.deploy.server import set_threads
from minions.settings import DEFAULTS
from harness.triton_process import ROOT

BASE = ServerPorts("127.0.0.1", 8000, 8001, 8002, 9000)


def test_each_replica_has_ports_of_its_own():
    assert replica_ports(BASE, 0) == BASE
    assert replica_ports(BASE, 2) == ServerPorts("127.0.0.1", 8020, 8021, 8022, 9020)


def test_a_replica_runs_make_serve_on_its_ports_threads_and_cores():
    command = Replica(1, replica_ports(BASE, 1), Path("/b/replica-1")).command(Path("deploy.yaml"), 2, pin=True)
    assert command[:3] == [command[0], "-c", "2-3"] and command[0].endswith("taskset")
    assert "--threads=2" in command and "--build=/b/replica-1" in command
    assert {"--http-port=8010", "--grpc-port=8011", "--metrics-port=8012", "--openai-port=9010"} <= set(command)
    assert "taskset" not in " ".join(Replica(0, BASE, Path("/b")).command(Path("deploy.yaml"), 1, pin=False))


def test_threads_apply_to_every_compute_engine_and_no_lookup():
    dep = load_deployment(ROOT / "deploy.torch.yaml")
    set_threads(dep, 1)
    engines = [dep.llm, *dep.ssms]
    assert all(m["num_threads"] == 1 for m in engines if m["engine"] in ("llamacpp", "torch", "distilled"))
    assert all("num_threads" not in m for m in engines if m["engine"] in ("ngram", "suffix"))


def test_affinity_thresholds_follow_a_replicas_slots():
    assert Affinity.of(DEFAULTS.with_keys(max_active_requests=16)).abs_threshold == 2
    assert Affinity.of(DEFAULTS.with_keys(max_active_requests=64)).abs_threshold == 8
    assert Affinity.of(DEFAULTS.with_keys(max_active_requests=4)).abs_threshold == 1


def test_the_gateway_routes_by_prefix_or_round_robin():
    workers = ["http://127.0.0.1:9000", "http://127.0.0.1:9010"]
    affinity = gateway_command("python", 9100, workers, Affinity(2), 9101)
    assert "--policy=cache_aware" in affinity and "--balance-abs-threshold=2" in affinity
    assert affinity[affinity.index("--worker-urls") + 1:][:2] == workers
    control = gateway_command("python", 9100, workers, None, 9101)
    assert "--policy=round_robin" in control and not any("balance" in a for a in control)
