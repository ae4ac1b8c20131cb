"""Helpers shared by the engine and orchestrator adapters: config parameters, input tensors, logging."""

from __future__ import annotations

import faulthandler
import gc
import json
import logging
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def model_config(args: dict) -> dict:
    return json.loads(args["model_config"])


def string_parameters(config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def input_arrays(request) -> dict[str, np.ndarray]:
    """The request's inputs as numpy arrays, by name: those it carries, read in one pass (Triton lets
    only the model's declared inputs through). One lookup per declared name would rebuild the
    request's tensor list for each of the dozens of names an engine model declares."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


CANCEL_CHECK_INTERVAL_S = 0.25
"""How often a request under way asks Triton whether its client cancelled: the question is a round trip
to tritonserver that spins on the cores the engines need, too dear to ask for every streamed token or
every 50 ms (docs/engines.md, the per-token hop)."""


def error(message: str, code=None):
    return pb_utils.TritonError(message, code if code is not None else pb_utils.TritonError.INTERNAL)


def series_labels(model: str, **labels: str) -> dict[str, str]:
    """The labels of a model's custom metric series: the model, and the stub process serving it.

    Triton 2.51 hands two instances the same series when their family names and labels are equal (one
    Prometheus object), and deleting either's Metric frees it under the other: reloading a model
    crashed tritonserver as soon as the new instance updated a metric the old one had just released
    (docs/operations.md). The stub's pid keeps each instance's series its own."""
    return {"model": model, "stub": str(os.getpid()), **labels}


class TritonLogHandler(logging.Handler):
    """Routes the package's `logging` records into Triton's log, so one log says what happened."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = pb_utils.Logger
        message = f"{record.name}: {self.format(record)}"
        if record.levelno >= logging.ERROR:
            logger.log_error(message)
        elif record.levelno >= logging.WARNING:
            logger.log_warn(message)
        else:
            logger.log_info(message)


def setup_logging() -> None:
    # A stub that crashes in native code (Triton reports it "not healthy" and logs nothing) writes the
    # Python stack of every thread to its stderr, which tritonserver's log collects.
    faulthandler.enable(all_threads=True)
    root = logging.getLogger("minions")
    if not any(isinstance(h, TritonLogHandler) for h in root.handlers):
        root.addHandler(TritonLogHandler())
        root.setLevel(logging.INFO)
        root.propagate = False


def release_metrics(owner: object) -> None:
    """Drop the pb_utils metrics and metric families an object holds, and collect them, while the stub
    can still reach tritonserver: freed later, at the stub's exit, they crash it (docs/operations.md)."""
    def is_metric(x: object) -> bool:  # pb_utils names MetricFamily only; Metric is the stub's own class
        return type(x).__name__ in ("Metric", "MetricFamily")

    for name, value in list(vars(owner).items()):
        if isinstance(value, dict) and any(is_metric(x) for item in value.items() for x in item):
            setattr(owner, name, {})
        elif is_metric(value):
            setattr(owner, name, None)
    gc.collect()
