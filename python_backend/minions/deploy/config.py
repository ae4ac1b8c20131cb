"""deploy.yaml: the one file a deployment is described by, loaded and checked."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from minions.settings import EngineKind

ROOT = Path(__file__).resolve().parents[3]
"""The project's root (deploy.yaml, model_repository/, build/)."""
TEMPLATE_BY_ENGINE = {EngineKind.TORCH: "torch", EngineKind.DISTILLED: "torch", EngineKind.LLAMACPP: "llamacpp",
                      EngineKind.NGRAM: "lookup", EngineKind.SUFFIX: "lookup", EngineKind.TENSORRTLLM: "tensorrt_llm"}
"""Which model_repository/ template serves each engine kind."""
DECOUPLED_TEMPLATES = {"llamacpp", "tensorrt_llm"}
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
        return cls(s.get("host", "127.0.0.1"), int(s.get("http_port", 8000)), int(s.get("grpc_port", 8001)),
                   int(s.get("metrics_port", 8002)), int(s.get("openai_port", 9000)))

    @property
    def loopback_grpc_url(self) -> str:
        """The gRPC endpoint as the server's own models reach it."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        return f"{host}:{self.grpc}"


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


def resolve(p: str | Path, base: Path) -> Path:
    p = Path(os.path.expanduser(str(p)))
    return p if p.is_absolute() else (base / p).resolve()


def load_deployment(path: str | Path) -> Deployment:
    path = Path(path).resolve()
    raw = yaml.safe_load(path.read_text())
    for key in ("llm", "orchestrator"):
        if key not in raw:
            raise ValueError(f"{path}: missing section {key!r}")
    names = [raw["llm"]["name"]] + [s["name"] for s in raw.get("ssms", [])]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: model names must be unique, got {names}")
    for m in [raw["llm"], *raw.get("ssms", [])]:
        if m.get("engine") not in TEMPLATE_BY_ENGINE:
            raise ValueError(f"{path}: model {m.get('name')!r} has unknown engine {m.get('engine')!r} "
                             f"(one of {EngineKind.listed()})")
    return Deployment(raw, path, dict(raw.get("server", {})))


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
