"""The orchestrator's own instances of the repository's lookup drafters (engines/in_process.py says why).

Each is built from its Triton model's config.pbtxt as the repository holds it when the orchestrator
loads, so it drafts as the model would; the Triton model stays loaded, and its readiness still
decides whether requests draft with it (ModelControl).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from minions.engines.api import Engine
from minions.engines.factory import build_engine
from minions.settings import EngineSettings

log = logging.getLogger("minions.orchestrator")


def repository_parameters(repository: Path, model: str) -> dict[str, str]:
    """A model's string parameters, as its config.pbtxt in the repository gives them."""
    config = text_format.Parse((repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    return {k: v.string_value for k, v in config.parameters.items()}


def in_process_lookups(repository: Path, models: Iterable[str]) -> dict[str, Engine]:
    """An engine per lookup model; one whose config cannot be read or built is left to its Triton model."""
    engines: dict[str, Engine] = {}
    for model in models:
        try:
            engines[model] = build_engine(EngineSettings.from_params(repository_parameters(repository, model)))
        except (OSError, ValueError, text_format.ParseError) as exc:
            log.warning("%s: drafting through its Triton model: its config could not be read (%s)", model, exc)
    return engines
