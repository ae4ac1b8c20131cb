"""deploy.yaml: the one file a deployment is described by, loaded and checked."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from minions.deploy import schema
from minions.settings import EngineKind, OrchestratorSettings

ROOT = Path(__file__).resolve().parents[3]
"""The project's root (deploy.yaml, model_repository/, build/)."""
TEMPLATE_BY_ENGINE = {EngineKind.TORCH: "torch", EngineKind.DISTILLED: "torch", EngineKind.LLAMACPP: "llamacpp",
                      EngineKind.NGRAM: "lookup", EngineKind.SUFFIX: "lookup", EngineKind.TENSORRTLLM: "tensorrt_llm"}
"""Which model_repository/ template serves each engine kind."""
DECOUPLED_TEMPLATES = {"llamacpp", "torch", "tensorrt_llm"}
"""Templates of decoupled engine models (in-flight batching); the orchestrator calls them accordingly."""


@dataclass
class ServerPorts:
    """Where tritonserver listens."""

    host: str
    http: int
    grpc: int
    metrics: int
    openai: int = 0
    """The OpenAI-compatible frontend's port (minions.frontend); 0: no frontend."""

    @classmethod
    def of(cls, dep: Deployment) -> ServerPorts:
        """The ports deploy.yaml's `server` section names (Triton's defaults where it names none; the
        OpenAI frontend on 9000)."""
        s = dep.server
        return cls(s.get("host", "127.0.0.1"), int(s.get("http_port", 8000)), grpc=int(s.get("grpc_port", 8001)),
                   metrics=int(s.get("metrics_port", 8002)), openai=int(s.get("openai_port", 9000)))

    @property
    def loopback_host(self) -> str:
        """The address the server's own processes reach it at."""
        return "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host

    @property
    def loopback_grpc_url(self) -> str:
        """The gRPC endpoint as the server's own models reach it."""
        return f"{self.loopback_host}:{self.grpc}"

    @property
    def loopback_metrics_url(self) -> str:
        return f"http://{self.loopback_host}:{self.metrics}/metrics"


@dataclass
class Deployment:
    raw: dict
    path: Path
    server: dict = field(default_factory=dict)

    @property
    def cache_dir(self) -> Path:
        return resolve(self.raw.get("cache_dir", ".cache/minions"), self.path.parent)

    @property
    def llm(self) -> dict:
        return self.raw["llm"]

    @property
    def ssms(self) -> list[dict]:
        """The SSMs to serve: optional ones only when their artifacts exist (e.g. after `make distill`)."""
        return [s for s in self.raw.get("ssms", []) if not s.get("optional") or artifacts_present(s, self)]

    @property
    def missing_ssms(self) -> list[dict]:
        served = self.ssms
        return [s for s in self.raw.get("ssms", []) if s not in served]

    @property
    def orchestrator(self) -> dict:
        return self.raw["orchestrator"]

    @property
    def orchestrator_name(self) -> str:
        """The orchestrator model's name: its `name`, else OrchestratorSettings' default."""
        return str(self.orchestrator.get("name", OrchestratorSettings.model_name))


class DeploymentError(ValueError):
    """A deployment file that cannot be served, with every problem found: one line each,
    `<file>: <key path>: <problem>`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def resolve(p: str | Path, base: Path) -> Path:
    p = Path(os.path.expanduser(str(p)))
    return p if p.is_absolute() else (base / p).resolve()


def load_deployment(path: str | Path) -> Deployment:
    """The deployment a file describes, checked against the schema (deploy/schema.py); DeploymentError
    names every problem, each prefixed with the path as given."""
    shown, path = str(path), Path(path).resolve()
    try:
        raw = schema.normalized(yaml.safe_load(path.read_text()))
    except OSError as exc:
        raise DeploymentError([f"{shown}: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        raise DeploymentError([f"{where}: {getattr(exc, 'problem', None) or exc}"]) from None
    problems = schema.problems(raw)
    if problems:
        raise DeploymentError([f"{shown}: {p}" for p in problems])
    return Deployment(raw, path, dict(raw.get("server", {})))


def load_or_exit(path: str | Path) -> Deployment:
    """load_deployment for a command line: a file with problems ends the program with them on stderr, one
    line each, and exit status 1 (no traceback)."""
    try:
        return load_deployment(path)
    except DeploymentError as exc:
        raise SystemExit(str(exc)) from None


def trtllm_engine_dir(model: dict, dep: Deployment) -> Path:
    """Where a tensorrtllm model's engine is built and served from: its `engine_dir`, else
    <cache_dir>/trtllm/<name>."""
    if model.get("engine_dir"):
        return resolve(model["engine_dir"], dep.path.parent)
    return dep.cache_dir / "trtllm" / model["name"]


def distilled_dir(model: dict, dep: Deployment) -> Path:
    """A distilled SSM's directory: `source` relative to the cache directory (where make distill writes)."""
    return resolve(model.get("source", model["name"]), dep.cache_dir)


def artifacts_present(model: dict, dep: Deployment) -> bool:
    from minions.engines.distilled_model import is_distilled_dir

    return model.get("engine") != EngineKind.DISTILLED or is_distilled_dir(distilled_dir(model, dep))
