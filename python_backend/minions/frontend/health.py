"""Whether this replica can serve a request now: what `/health` answers, for a balancer or a readiness probe.

Triton's own readiness is not enough: it stays ready with the LLM unloaded (the orchestrator then refuses
every request), and Triton 2.51 keeps a model ready whose Python stub died. So a replica serves only while
the orchestrator and the LLM are ready in Triton, the orchestrator has a live stub (read from /proc, given
the model repository) and that stub says, through its `minions_llm_ready` gauge on Triton's metrics port,
that it sends requests to the LLM (it reports 0 while the LLM is not ready or is being loaded again after
its stub died: triton/model_control.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.request
from collections.abc import Callable, Collection
from pathlib import Path

from minions.frontend.triton_stream import TritonError, TritonStream
from minions.triton.stubs import live_stub_pids

log = logging.getLogger("minions.frontend")

LLM_READY_GAUGE = "minions_llm_ready"
SERIES = re.compile(r'^(?P<name>\w+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)', re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
METRICS_TIMEOUT_S = 5.0


def prometheus_samples(metrics: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each labelled series of metric `name` in Prometheus text `metrics`: its labels and value."""
    return [(dict(LABEL.findall(m["labels"])), float(m["value"])) for m in SERIES.finditer(metrics)
            if m["name"] == name]


def gauge_of_stubs(metrics: str, name: str, stubs: Collection[int]) -> list[float]:
    """The values of gauge `name` in Prometheus text `metrics`, from the series whose `stub` label is one
    of `stubs` (a dead stub's series can outlive it)."""
    pids = {str(pid) for pid in stubs}
    return [value for labels, value in prometheus_samples(metrics, name) if labels.get("stub") in pids]


def read_url(url: str, timeout_s: float = METRICS_TIMEOUT_S) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read().decode()


class ReplicaHealth:
    """Why `triton`'s orchestrator cannot serve now, or None; the stub checks need the model repository on
    this host, the gauge Triton's metrics URL as well."""

    def __init__(self, triton: TritonStream, repository: Path | None = None, metrics_url: str | None = None,
                 fetch: Callable[[str], str] = read_url, stubs: Callable[[Path], list[int]] = live_stub_pids) -> None:
        self.triton, self.repository, self.metrics_url = triton, repository, metrics_url
        self.fetch, self.stubs = fetch, stubs
        self._last: str | None = None
        """The last check's reason (None: serving), so that each change is logged once."""

    async def check(self) -> str | None:
        """`unavailable()`, logged when it changed since the last check."""
        reason = await self.unavailable()
        if reason != self._last:
            if reason is None:
                log.info("health: serving")
            else:
                log.warning("health: not serving: %s", reason)
            self._last = reason
        return reason

    async def unavailable(self) -> str | None:
        orchestrator = self.triton.model
        if not await self.triton.ready(orchestrator):
            return f"the orchestrator model {orchestrator!r} is not ready"
        try:
            llm = await self.triton.llm_model()
        except TritonError as exc:
            return f"the orchestrator's config cannot be read: {exc}"
        if not await self.triton.ready(llm):
            return f"the LLM model {llm!r} is not ready"
        if self.repository is None:
            return None
        stubs = self.stubs(self.repository / orchestrator)
        if not stubs:
            return f"the orchestrator model {orchestrator!r} has no live stub process (it is being loaded again)"
        if self.metrics_url is None:
            return None
        try:
            metrics = await asyncio.to_thread(self.fetch, self.metrics_url)
        except OSError as exc:
            return f"Triton's metrics ({self.metrics_url}) cannot be read: {exc}"
        ready = gauge_of_stubs(metrics, LLM_READY_GAUGE, stubs)
        if not ready or min(ready) != 1.0:
            return f"the orchestrator refuses requests: its LLM {llm!r} is not serving ({LLM_READY_GAUGE} " \
                   f"{ready[0] if ready else 'not yet reported'})"
        return None
