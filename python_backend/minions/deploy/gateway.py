"""The SGLang Model Gateway (`sglang-router`) in front of Minions replicas: its command line, with prefix
affinity tuned to what one replica really holds.

The gateway's `cache_aware` policy sends a request to the replica whose routed text shares the most with
it, unless the replicas are imbalanced: the busiest holds more than `balance_abs_threshold` requests over
the least busy *and* more than `balance_rel_threshold` times as many, when the least busy one gets it.
Its defaults (64 and 1.5) suit GPU replicas holding hundreds of requests; a replica here decodes
`active_requests_limit` at once (the LLM's max_sequences unless set), so the gap worth leaving a
conversation's KV for is an eighth of that, at least one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minions.settings import OrchestratorSettings

GATEWAY_MODULE = "sglang_router.launch_router"
"""The gateway, from the PyPI package sglang-router (pinned in requirements.txt)."""
AFFINITY_POLICY = "cache_aware"
REL_THRESHOLD = 1.2
"""How many times the least busy replica's requests the busiest must hold to count as imbalanced."""
HEALTH_ENDPOINT = "/health"
"""What the gateway probes on each replica's OpenAI port (frontend/app.py: 503 while it cannot serve)."""
HEALTH_CHECKS = ["--health-check-interval-secs=2", "--health-failure-threshold=1", "--health-success-threshold=1"]
"""A replica that stops serving leaves the rotation within about 2 s (the gateway's default: 3 failed
checks 60 s apart), and comes back at its first 200."""


@dataclass(frozen=True)
class Affinity:
    """cache_aware's balance thresholds for replicas of one deployment."""

    abs_threshold: int
    rel_threshold: float = REL_THRESHOLD

    @classmethod
    def of(cls, orchestrator: OrchestratorSettings) -> Affinity:
        """For replicas that decode `orchestrator.active_requests_limit` requests at once: e.g. 16 slots
        give an absolute threshold of 2 (two requests more than the least busy replica, and 1.2x)."""
        return cls(max(1, orchestrator.active_requests_limit // 8))

    def args(self) -> list[str]:
        return [f"--balance-abs-threshold={self.abs_threshold}", f"--balance-rel-threshold={self.rel_threshold}"]


def gateway_command(python: str, port: int, workers: Sequence[str], affinity: Affinity | None,
                    metrics_port: int, host: str = "127.0.0.1", log_level: str = "warn") -> list[str]:
    """The gateway's command line on `host:port` in front of `workers` (their OpenAI base URLs): prefix
    affinity with `affinity`'s thresholds, or round-robin without it (the control that shows what
    affinity buys); its own Prometheus metrics on `metrics_port` (two gateways on one host cannot
    share its default, 29000)."""
    policy = [f"--policy={AFFINITY_POLICY}", *affinity.args()] if affinity else ["--policy=round_robin"]
    return [python, "-m", GATEWAY_MODULE, f"--host={host}", f"--port={port}", "--worker-urls", *workers, *policy,
            f"--health-check-endpoint={HEALTH_ENDPOINT}", *HEALTH_CHECKS, f"--prometheus-host={host}",
            f"--prometheus-port={metrics_port}", f"--log-level={log_level}"]
