"""Small request helpers for the integration tests (raw tritonclient calls where the client library
would hide what is under test)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

COPY_PROMPT = ("Copy this Python code exactly:\n```python\ndef add(a, b):\n    return a + b\n\n"
               "def subtract(a, b):\n    return a - b\n```")
"""Copy-heavy: prompt lookup and suffix matching draft on it, and the LLM accepts."""


def http_post(url: str, body: dict | str, timeout: float = 120.0) -> tuple[int, str]:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def grpc_tensor(name: str, array: np.ndarray, triton_type: str):
    t = grpcclient.InferInput(name, list(array.shape), triton_type)
    t.set_data_from_numpy(array)
    return t


def metric_value(metrics_url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples on Triton's metrics port whose labels include `labels`."""
    with urllib.request.urlopen(metrics_url, timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
