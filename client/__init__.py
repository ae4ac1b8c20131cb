"""Minions client: stream completions from the `minions` Triton model over gRPC or HTTP (SSE)."""

from .api import Completion, GenerationParams, MinionsClientError, generate

__all__ = ["Completion", "GenerationParams", "MinionsClientError", "generate"]
