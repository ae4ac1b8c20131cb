"""Triton entry point; the engine adapter lives in minions.triton.engine_model."""

from minions.triton.engine_model import TritonPythonModel  # noqa: F401
