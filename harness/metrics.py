"""Reading Triton's metrics port: a metric's samples by label, and their sum."""

from __future__ import annotations

from minions.frontend.health import prometheus_samples, read_url

READ_TIMEOUT_S = 30.0
"""A busy server's metrics port may answer slowly; a read that fails fails its test or tool."""


def metric_samples(metrics_url: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of a Prometheus metric on Triton's metrics port whose labels include `labels`: each
    sample's labels and value."""
    return [(found, value) for found, value in prometheus_samples(read_url(metrics_url, READ_TIMEOUT_S), name)
            if all(found.get(k) == v for k, v in labels.items())]


def metric_value(metrics_url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples on Triton's metrics port whose labels include `labels`."""
    return sum(value for _, value in metric_samples(metrics_url, name, **labels))
