"""k8s/: Minions replicas behind the SGLang Model Gateway on Kubernetes, checked without a cluster.

Each overlay (k8s/cpu, k8s/gpu) is rendered as `kubectl apply -k` renders a resources-only kustomization: its
`resources` followed recursively, every YAML document loaded. Every document validates strictly (no unknown field)
against the Kubernetes 1.30 schemas that the kubernetes-validate package ships. Then what ties the pieces
together and to the deploy file the replicas serve: the autoscaler's metrics are the ones the prometheus-adapter
rules produce and it scales the replica Deployment; the probes (readiness /health on the OpenAI port, liveness
/v2/health/live on Triton's HTTP port); the container and Service ports are the deploy file's; the gateway
discovers the replica pods by their label on the OpenAI port, with the balance thresholds gateway.Affinity
computes for the deploy file, under a ServiceAccount allowed to watch pods; the CPU image's deploy file differs
from deploy.yaml in server.host alone, and the GPU engines are built where Triton reads them. No cluster runs
these manifests in CI, so this is what keeps them from drifting from the project's own numbers unseen. Every
check is also run against a manifest broken on purpose, which it must reject.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from sglang_router.launch_router import parse_router_args
from sglang_router.router_args import RouterArgs

import minions.deploy.render as render_module
from minions.deploy.config import ServerPorts, load_deployment
from minions.deploy.gateway import AFFINITY_POLICY, GATEWAY_MODULE, HEALTH_ENDPOINT, Affinity

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_FILES = {"cpu": "deploy.yaml", "gpu": "deploy.gpu.yaml"}
"""Each overlay and the deploy file (in the repository) whose ports and orchestrator its replicas have."""
K8S_VERSION = "1.30"
REPLICA, GATEWAY = "minions-replica", "minions-gateway"


def render(path: Path) -> list[dict]:
    """The documents `kubectl apply -k` applies for a kustomization directory, or those of one file."""
    if path.is_file():
        return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    kustomization = yaml.safe_load((path / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}, f"{path}: resources only, no patches"
    return [doc for resource in kustomization["resources"] for doc in render(path / resource)]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def pod(docs: list[dict], name: str = REPLICA) -> dict:
    return one(docs, "Deployment", name)["spec"]["template"]


def named_ports(docs: list[dict]) -> dict[str, tuple[int, dict]]:
    """The replica's container ports by name: (number, the container that declares it)."""
    return {p["name"]: (p["containerPort"], c) for c in pod(docs)["spec"]["containers"] for p in c.get("ports", [])}


def flag(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def gateway(docs: list[dict]) -> RouterArgs:
    """The gateway's command line as sglang-router (the pinned version) parses it, each $(VAR) first expanded
    as Kubernetes expands it from the container's env."""
    [container] = pod(docs, GATEWAY)["spec"]["containers"]
    env = {}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("configMapKeyRef")
        env[var["name"]] = one(docs, "ConfigMap", ref["name"])["data"][ref["key"]] if ref else var.get("value", "ns")
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], arg) for arg in container["command"]]
    assert command[:3] == ["python", "-m", GATEWAY_MODULE]
    return parse_router_args(command[3:])


def adapter_metrics(docs: list[dict]) -> set[str]:
    """The metric names prometheus-adapter's rules produce: `name.matches` applied to the series queried, as `as`."""
    rules = yaml.safe_load(one(docs, "ConfigMap", "minions-prometheus-adapter-rules")["data"]["config.yaml"])["rules"]
    names = set()
    for rule in rules:
        series = re.match(r"\s*(\w+)", rule["seriesQuery"])[1]
        match = re.search(rule["name"]["matches"], series)
        assert match, f"{rule['name']['matches']} does not match {series}"
        names.add(match.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule["name"].get("as", "$0"))))
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    return names


def check_autoscaler(docs: list[dict], expected: dict) -> None:
    """It scales the replica Deployment, on metrics that prometheus-adapter's rules produce."""
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": REPLICA}
    one(docs, "Deployment", REPLICA)
    wanted = {m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"}
    assert "nv_inference_queue_to_compute_ratio" in wanted
    assert wanted <= adapter_metrics(docs), f"no adapter rule produces {wanted - adapter_metrics(docs)}"


def check_probes(docs: list[dict], expected: dict) -> None:
    ports = named_ports(docs)
    assert ports["openai"][1]["readinessProbe"]["httpGet"] == {"path": HEALTH_ENDPOINT, "port": "openai"}
    for probe in ("livenessProbe", "startupProbe"):
        assert ports["http"][1][probe]["httpGet"] == {"path": "/v2/health/live", "port": "http"}, probe


def check_ports(docs: list[dict], expected: dict) -> None:
    ports = {name: number for name, (number, _) in named_ports(docs).items()}
    assert ports == expected["ports"]
    service = one(docs, "Service", REPLICA)["spec"]["ports"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service} == {n: (p, n) for n, p in ports.items()}


def check_gateway_selector(docs: list[dict], expected: dict) -> None:
    labels = pod(docs)["metadata"]["labels"]
    for chosen in (gateway(docs).selector, one(docs, "Service", REPLICA)["spec"]["selector"],
                   one(docs, "Deployment", REPLICA)["spec"]["selector"]["matchLabels"]):
        assert chosen and chosen.items() <= labels.items(), f"{chosen} does not select {labels}"


def check_gateway_routing(docs: list[dict], expected: dict) -> None:
    args = gateway(docs)
    assert args.service_discovery and args.service_discovery_port == expected["ports"]["openai"]
    assert (args.policy, args.health_check_endpoint) == (AFFINITY_POLICY, HEALTH_ENDPOINT)


def check_gateway_thresholds(docs: list[dict], expected: dict) -> None:
    args = gateway(docs)
    assert Affinity(args.balance_abs_threshold, args.balance_rel_threshold) == expected["affinity"]


def check_gateway_rbac(docs: list[dict], expected: dict) -> None:
    account = pod(docs, GATEWAY)["spec"]["serviceAccountName"]
    one(docs, "ServiceAccount", account)
    bindings = [b for b in docs if b["kind"] == "RoleBinding"
                and {"kind": "ServiceAccount", "name": account} in b["subjects"] and b["roleRef"]["kind"] == "Role"]
    rules = [r for b in bindings for r in one(docs, "Role", b["roleRef"]["name"])["rules"]]
    assert any("" in r["apiGroups"] and "pods" in r["resources"] and {"get", "list", "watch"} <= set(r["verbs"])
               for r in rules), f"{account} may not watch pods: {rules}"


CHECKS = [check_autoscaler, check_probes, check_ports, check_gateway_selector,
          check_gateway_routing, check_gateway_thresholds, check_gateway_rbac]


BREAKAGES = {  # a manifest broken on purpose, and the check that must reject it
    "a metric no rule makes": (check_autoscaler, lambda d: one(d, "HorizontalPodAutoscaler")["spec"]["metrics"][0][
        "pods"]["metric"].update(name="nv_inference_queue_compute_ratio")),
    "the gateway scaled": (check_autoscaler, lambda d: one(d, "HorizontalPodAutoscaler")["spec"][
        "scaleTargetRef"].update(name=GATEWAY)),
    "ready on Triton's word": (check_probes, lambda d: named_ports(d)["openai"][1]["readinessProbe"]["httpGet"].update(
        path="/v2/health/ready")),
    "alive on the frontend": (check_probes, lambda d: named_ports(d)["http"][1]["livenessProbe"]["httpGet"].update(
        port="openai")),
    "a port off the deploy file": (check_ports, lambda d: next(
        p for p in named_ports(d)["grpc"][1]["ports"] if p["name"] == "grpc").update(containerPort=18001)),
    "pods the gateway misses": (check_gateway_selector, lambda d: pod(d)["metadata"]["labels"].update(
        {"app.kubernetes.io/name": "minions"})),
    "discovery on port 8000": (check_gateway_routing, lambda d: (lambda c: c.__setitem__(
        c.index("--service-discovery-port") + 1, "8000"))(pod(d, GATEWAY)["spec"]["containers"][0]["command"])),
    "sglang's default thresholds": (check_gateway_thresholds, lambda d: one(d, "ConfigMap", "minions-gateway-affinity")[
        "data"].update({"balance-abs-threshold": "64"})),
    "a Role that only gets": (check_gateway_rbac, lambda d: one(d, "Role")["rules"][0].update(verbs=["get"])),
}


@pytest.fixture(scope="module", params=sorted(DEPLOY_FILES))
def overlay(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def docs(overlay: str) -> list[dict]:
    return render(ROOT / "k8s" / overlay)


@pytest.fixture(scope="module")
def expected(overlay: str, docs: list[dict]) -> dict:
    """The deploy file's ports (its frontend's where a container of its own runs it, as deploy.gpu.yaml asks) and
    Affinity. The tokenizer is not read: it does not enter the thresholds, and deploy.gpu.yaml's is not here."""
    dep = load_deployment(ROOT / DEPLOY_FILES[overlay])
    ports = ServerPorts.of(dep)
    openai = ports.openai
    if not openai:
        frontend = next(c["command"] for c in pod(docs)["spec"]["containers"] if "minions.frontend" in c["command"])
        assert flag(frontend, "--grpc-url") == f"127.0.0.1:{ports.grpc}"
        openai = int(flag(frontend, "--port"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render_module, "tokenizer_dir_for", lambda source, dep: ROOT)
        affinity = Affinity.of(render_module.orchestrator_settings(dep))
    return {"ports": {"http": ports.http, "grpc": ports.grpc, "metrics": ports.metrics, "openai": openai},
            "affinity": affinity, "host": ports.host}


def test_every_document_validates_against_the_kubernetes_schemas(docs: list[dict]) -> None:
    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            where = ".".join(map(str, getattr(exc, "path", [])))
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {where}: {exc.message}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_manifests(check, docs: list[dict], expected: dict) -> None:
    check(docs, expected)


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_manifest_is_rejected(breakage: str, docs: list[dict], expected: dict) -> None:
    check, breaking = BREAKAGES[breakage]
    broken = copy.deepcopy(docs)
    breaking(broken)
    with pytest.raises(AssertionError):
        check(broken, expected)


def test_replicas_serve_the_deploy_file_on_every_address(overlay: str, docs: list[dict], expected: dict,
                                                        tmp_path: Path) -> None:
    """The GPU replica serves deploy.gpu.yaml, which binds 0.0.0.0; the CPU one deploy.container.yaml, which
    docker/cpu.Dockerfile makes from deploy.yaml by changing server.host alone (its RUN line is run here)."""
    served = flag(named_ports(docs)["http"][1]["command"], "--deploy")
    if overlay == "gpu":  # and the engines it loads are built for that file, in the volume it reads
        assert served == DEPLOY_FILES["gpu"] and expected["host"] == "0.0.0.0"
        [engines] = pod(docs)["spec"]["initContainers"]
        assert engines["command"][-5:] == ["python3", "-m", "minions.deploy.trtllm_build", "--deploy", served]
        cache = f"{engines['workingDir']}/{load_deployment(ROOT / served).cache_dir.relative_to(ROOT).as_posix()}"
        for container in (engines, named_ports(docs)["http"][1]):
            assert {"name": "model-cache", "mountPath": cache} in container["volumeMounts"]
        return
    lines = re.sub(r"\\\n", " ", (ROOT / "docker" / "cpu.Dockerfile").read_text()).splitlines()
    run = next(ln.split(None, 1)[1] for ln in lines if ln.startswith("RUN ") and f"> {served}" in ln)
    shutil.copy(ROOT / DEPLOY_FILES["cpu"], tmp_path)
    subprocess.run(["bash", "-c", run], cwd=tmp_path, check=True)
    derived, original = (load_deployment(tmp_path / f) for f in (served, DEPLOY_FILES["cpu"]))
    assert ServerPorts.of(derived).host == "0.0.0.0"
    assert derived.raw | {"server": original.server} == original.raw
    assert derived.server == original.server | {"host": "0.0.0.0"}
