"""Triton entry point; the orchestrator adapter lives in minions.triton.orchestrator_model."""

from minions.triton.orchestrator_model import TritonPythonModel  # noqa: F401
