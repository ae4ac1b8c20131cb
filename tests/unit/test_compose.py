"""docker-compose.yml and docker/triton.Dockerfile, the GPU production deployment of deploy.gpu.yaml, checked
without Docker.

The file, with every `${VAR:-default}` taken at its default as `docker compose` does with nothing set, must
validate against the Compose Specification's JSON schema (github.com/compose-spec/compose-spec, Apache-2.0),
read from the check-jsonschema package, which vendors it as check_jsonschema/builtin_schemas/vendor/
compose-spec.json with its licence. Then the structure the deployment relies on: the commands run modules and
files of this repository, GPUs for engines and triton, the start order, loopback-by-default ports that match
deploy.gpu.yaml's server section, healthchecks, and the image's base, environment and pinned requirements.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import yaml

from minions.deploy.config import Deployment, ServerPorts, load_deployment
from minions.settings import OrchestratorSettings
from tests.support.requirements import pins

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy.gpu.yaml"
SERVICES = ("engines", "triton", "openai", "locust")
GPU_SERVICES = ("engines", "triton")
BIND_VAR = "MINIONS_BIND"
VARIABLE = re.compile(r"\$\$|\$\{(?P<braced>\w+)(?P<sep>:?-)?(?P<default>[^}]*)\}|\$(?P<plain>\w+)")
"""Compose's interpolation: `$$` (a literal $), `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `$VAR`."""
DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
DURATION_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def without_defaults(value: object) -> set[str]:
    """The variables named in `value` (any nesting of dicts, lists and strings) that have no default."""
    if isinstance(value, dict):
        return set().union(*map(without_defaults, value.values()))
    if isinstance(value, list):
        return set().union(*map(without_defaults, value))
    if isinstance(value, str):
        return {m["braced"] or m["plain"] for m in VARIABLE.finditer(value)
                if (m["braced"] and not m["sep"]) or m["plain"]}
    return set()


def at_defaults(value: object) -> object:
    """`value` with every variable replaced by its default, what `docker compose` reads with nothing set."""
    if isinstance(value, dict):
        return {k: at_defaults(v) for k, v in value.items()}
    if isinstance(value, list):
        return [at_defaults(v) for v in value]
    if isinstance(value, str):
        return VARIABLE.sub(lambda m: "$" if m[0] == "$$" else (m["default"] or ""), value)
    return value


def seconds(duration: str) -> float:
    """A Compose duration (`1m30s`, `20m`) in seconds."""
    assert re.fullmatch(f"(?:{DURATION.pattern})+", duration), duration
    return sum(float(n) * DURATION_S[unit] for n, unit in DURATION.findall(duration))


def size_bytes(size: str | int) -> int:
    """A Compose byte size (`2gb`, `512m`, 1024) in bytes."""
    m = re.fullmatch(r"(\d+)\s*([kmg]?b?)", str(size).lower())
    assert m, size
    return int(m[1]) * SIZE_UNITS[m[2]]


def flag(command: list[str], name: str) -> str:
    """The value after `name` in a command (`--port 9000`)."""
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip()) for ln in joined.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def raw() -> dict:
    """docker-compose.yml as written (YAML anchors and merge keys resolved by the loader)."""
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def compose(raw: dict) -> dict:
    return at_defaults(raw)


@pytest.fixture(scope="module")
def services(compose: dict) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    return load_deployment(DEPLOY)


@pytest.fixture(scope="module")
def ports(deployment: Deployment) -> ServerPorts:
    return ServerPorts.of(deployment)


@pytest.fixture(scope="module")
def dockerfile(services: dict[str, dict]) -> list[tuple[str, str]]:
    """The instructions of the Dockerfile the services' image is built from."""
    return dockerfile_instructions(ROOT / services["triton"]["build"]["dockerfile"])


@pytest.fixture(scope="module")
def image_env(dockerfile: list[tuple[str, str]]) -> dict[str, str]:
    """The ENV the Dockerfile sets (KEY=value form)."""
    return dict(kv.split("=", 1) for instr, args in dockerfile if instr == "ENV" for kv in shlex.split(args))


def test_validates_against_the_compose_spec_schema(compose: dict) -> None:
    schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)


def test_every_variable_has_a_default(raw: dict) -> None:
    """`docker compose up` needs no .env: every setting defaults."""
    assert not without_defaults(raw)


def test_services(services: dict[str, dict]) -> None:
    assert sorted(services) == sorted(SERVICES)


def test_one_image_built_from_the_dockerfile(services: dict[str, dict], dockerfile: list[tuple[str, str]]) -> None:
    """Every service runs the one image, built from the Dockerfile at the repository root, in its WORKDIR."""
    workdir = [args for instr, args in dockerfile if instr == "WORKDIR"]
    for name, service in services.items():
        assert service["image"] == services["triton"]["image"], name
        assert service["build"] == services["triton"]["build"], name
        assert service["working_dir"] == workdir[-1], name
    assert services["triton"]["build"]["context"] == "."


@pytest.mark.parametrize("name", SERVICES)
def test_command_runs_code_of_this_repository(services: dict[str, dict], image_env: dict[str, str],
                                              name: str) -> None:
    """`python3 -m MODULE` resolves on the image's PYTHONPATH (mapped onto this checkout), and every file the
    command names (deploy.gpu.yaml) is in the repository."""
    command = services[name]["command"]
    workdir = PurePosixPath(services[name]["working_dir"])
    assert command[:2] == ["python3", "-m"], command
    roots = [ROOT / PurePosixPath(p).relative_to(workdir) for p in image_env["PYTHONPATH"].split(":")]
    module = Path(*command[2].split("."))
    candidates = [r / f for r in roots for f in (module.with_suffix(".py"), module / "__main__.py")]
    assert any(c.is_file() for c in candidates), f"{command[2]} not found: {[str(c) for c in candidates]}"
    for arg in command[3:]:
        if re.search(r"\.(ya?ml|py|json)$", arg):
            assert (ROOT / arg).is_file(), arg


@pytest.mark.parametrize("name", SERVICES)
def test_gpu_reservations(services: dict[str, dict], name: str) -> None:
    """engines and triton reserve NVIDIA GPUs (at least one by default); openai and locust need none."""
    devices = services[name].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    if name in GPU_SERVICES:
        assert len(gpus) == 1 and int(gpus[0]["count"]) >= 1, devices
    else:
        assert not devices


def test_start_order(services: dict[str, dict]) -> None:
    """engines runs once to completion, then triton; openai and locust wait until triton is healthy."""
    assert services["engines"]["restart"] == "no"
    assert services["triton"]["depends_on"] == {"engines": {"condition": "service_completed_successfully"}}
    for name in ("openai", "locust"):
        assert services[name]["depends_on"] == {"triton": {"condition": "service_healthy"}}, name


def test_locust_only_in_its_profile(services: dict[str, dict]) -> None:
    """`docker compose up` starts everything but the load test."""
    assert services["locust"]["profiles"] == ["loadtest"]
    assert all("profiles" not in s for n, s in services.items() if n != "locust")


@pytest.mark.parametrize("name", SERVICES)
def test_published_ports_bind_a_configurable_loopback_address(raw: dict, name: str) -> None:
    """Every port is published as `${MINIONS_BIND:-127.0.0.1}:HOST:CONTAINER`, never on all interfaces by default."""
    prefix = f"${{{BIND_VAR}:-127.0.0.1}}:"
    for port in raw["services"][name].get("ports", []):
        assert isinstance(port, str) and port.startswith(prefix), port
        assert re.fullmatch(r"\d+:\d+", at_defaults(port.removeprefix(prefix))), port
    assert "network_mode" not in raw["services"][name]


def test_triton_ports_are_deploy_gpu_yaml_server_ports(services: dict[str, dict], ports: ServerPorts) -> None:
    """Published as they are; tritonserver listens on every interface of its container; the frontend is its
    own service, so the server starts none."""
    published = {p.split(":")[1]: p.split(":")[2] for p in services["triton"]["ports"]}
    assert published == {str(p): str(p) for p in (ports.http, ports.grpc, ports.metrics)}
    assert ports.host == "0.0.0.0"
    assert ports.openai == 0


def test_clients_reach_triton_on_its_ports(services: dict[str, dict], ports: ServerPorts,
                                           deployment: Deployment) -> None:
    openai, locust = services["openai"]["command"], services["locust"]["command"]
    assert flag(openai, "--grpc-url") == f"triton:{ports.grpc}"
    assert flag(openai, "--model") == deployment.orchestrator.get("name", OrchestratorSettings.model_name)
    assert flag(openai, "--host") == "0.0.0.0"
    assert services["openai"]["ports"] == [f"127.0.0.1:9000:{flag(openai, '--port')}"]
    assert flag(locust, "--host") == f"http://triton:{ports.http}"
    assert flag(locust, "--grpc-host") == f"triton:{ports.grpc}"


def test_healthchecks(services: dict[str, dict], ports: ServerPorts) -> None:
    """triton is healthy once its models are ready (after a long start period: engines load for minutes),
    openai once its /health answers."""
    urls = {"triton": f"localhost:{ports.http}/v2/health/ready",
            "openai": f"localhost:{flag(services['openai']['command'], '--port')}/health"}
    for name, url in urls.items():
        check = services[name]["healthcheck"]
        assert check["test"] == ["CMD", "curl", "-fs", url], name
        assert seconds(check["timeout"]) < seconds(check["interval"]), name
    assert seconds(services["triton"]["healthcheck"]["start_period"]) >= 10 * 60


def test_triton_runtime_limits(services: dict[str, dict]) -> None:
    """The Python backend's /dev/shm, and the ulimits NVIDIA recommends for tritonserver."""
    triton = services["triton"]
    assert size_bytes(triton["shm_size"]) >= 2**30
    assert triton["ulimits"] == {"memlock": -1, "stack": 67108864}


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_model_cache_mounted_where_deploy_gpu_yaml_reads_it(services: dict[str, dict], deployment: Deployment,
                                                           name: str) -> None:
    """The host's cache_dir (checkpoints in, engines out) is the container's cache_dir."""
    rel = deployment.cache_dir.relative_to(ROOT).as_posix()
    assert f"./{rel}:{services[name]['working_dir']}/{rel}" in services[name]["volumes"]


def test_locust_load_and_results(raw: dict, services: dict[str, dict]) -> None:
    """Users and run time come from the environment with defaults; the reports go to a mounted folder and the
    prompt sets come from one."""
    raw_command = raw["services"]["locust"]["command"]
    for name in ("--users", "--time"):
        assert re.fullmatch(r"\$\{\w+:-\d+\}", flag(raw_command, name)), flag(raw_command, name)
    locust = services["locust"]
    targets = [v.split(":")[1] for v in locust["volumes"]]
    assert flag(locust["command"], "--out") in targets
    assert locust["environment"]["MINIONS_DATASETS"] in targets


def test_dockerfile_base_image_and_environment(dockerfile: list[tuple[str, str]], image_env: dict[str, str],
                                               services: dict[str, dict]) -> None:
    args = dict(a.split("=", 1) for instr, a in dockerfile if instr == "ARG" and "=" in a)
    assert dockerfile[0] == ("ARG", "TRITON_VERSION=25.05")
    assert ("FROM", "nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-trtllm-python-py3") in dockerfile
    assert services["triton"]["build"]["args"]["TRITON_VERSION"] == args["TRITON_VERSION"]
    assert image_env["PYTHONPATH"] == "/workspace/minions/python_backend:/workspace/minions"
    assert image_env["HF_HUB_OFFLINE"] == "1"
    assert any(instr == "RUN" and "curl" in a for instr, a in dockerfile), "the healthchecks need curl"


def test_gpu_requirements_pinned_as_the_project(dockerfile: list[tuple[str, str]]) -> None:
    """The image installs docker/requirements.gpu.txt: a subset of requirements.txt at the same pins, without
    the CPU engines and torch (the base image's tensorrt_llm brings its own)."""
    gpu_reqs = ROOT / "docker" / "requirements.gpu.txt"
    assert any(instr == "RUN" and "-r docker/requirements.gpu.txt" in a for instr, a in dockerfile)
    gpu, project = pins(gpu_reqs), pins(ROOT / "requirements.txt")
    assert {"tritonclient", "pyyaml", "fastapi", "uvicorn", "locust"} <= set(gpu)
    assert not {"torch", "transformers", "llama-cpp-python", "nvidia-pytriton"} & set(gpu)
    assert None not in gpu.values(), gpu
    assert {k: project.get(k) for k in gpu} == gpu
