"""One row per request, which the Locust users append to a JSON-lines file and the summary reads.

Locust's own statistics keep no per-request rows; goodput and the plots over time need them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from client.api import MinionsClientError, SilentStreamError
from minions.errors import is_refusal

OK, UNAVAILABLE, TIMEOUT, ERROR = "ok", "unavailable", "timeout", "error"
"""Outcomes: served; refused by the server as over capacity; silent too long (cancelled); anything else."""
UNAVAILABLE_STATUSES: frozenset[int | str] = frozenset(
    {503, 429, "StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED"})
"""Transport statuses of a refusal: HTTP Service Unavailable / Too Many Requests and their gRPC kin."""


@dataclass
class RequestRecord:
    protocol: str
    """"http" or "grpc"."""
    start: float
    """Unix time the request was sent."""
    e2e_s: float
    """Send to last response (to the failure, for a failed request)."""
    outcome: str = OK
    ttft_s: float | None = None
    """Send to the first non-empty text chunk."""
    output_tokens: int = 0
    chunks: int = 0
    error: str | None = None

    @property
    def end(self) -> float:
        return self.start + self.e2e_s

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency, (E2E - TTFT) / (tokens - 1), as vLLM's TPOT and AIPerf's ITL: tokens
        arrive in chunks (a verified draft is several), so gaps between chunks are not gaps between tokens.
        None with fewer than two tokens."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


GRPC_TRANSPORT_FAILURES = ("failed to connect", "Socket closed", "Connection reset", "Connection refused")
"""gRPC gives a server it cannot reach (down, crashed) the status of a refusal, UNAVAILABLE; grpc core's
messages for those tell them apart. Over HTTP they are connection errors, not statuses."""


def outcome_of(exc: BaseException) -> str:
    """The outcome a failed request's exception stands for."""
    if isinstance(exc, SilentStreamError):
        return TIMEOUT
    if is_refusal(str(exc)):  # Minions' refusal, whose status a stream does not carry
        return UNAVAILABLE
    if isinstance(exc, MinionsClientError) and exc.status in UNAVAILABLE_STATUSES:
        lost = exc.status == "StatusCode.UNAVAILABLE" and any(m in str(exc) for m in GRPC_TRANSPORT_FAILURES)
        return ERROR if lost else UNAVAILABLE
    return ERROR


def append_record(path: str | Path, record: RequestRecord) -> None:
    """One line per write, opened in append mode: concurrent writers' lines do not interleave."""
    with open(path, "a") as f:
        f.write(json.dumps(asdict(record)) + "\n")


def read_records(path: str | Path) -> list[RequestRecord]:
    path = Path(path)
    if not path.exists():
        return []
    return [RequestRecord(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
