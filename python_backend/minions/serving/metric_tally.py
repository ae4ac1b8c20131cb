"""The speculation metrics a request produces, tallied in process and handed over in batches.

An update of a Triton custom metric is a synchronous round trip between the stub and tritonserver,
made while the stub holds the lock every other stub-to-server message waits for. Made per round
(per streamed token), those updates cost more than the token and were where the `minions` stub
crashed under 16 streams (docs/engines.md), so rounds only add to this tally and the adapter
exports its deltas a few times a second.
"""

from __future__ import annotations

from minions.speculation.rounds import Round

METRICS_FLUSH_INTERVAL_S = 0.5
"""How often the tally (and an engine model's gauges) are exported: a metric read right after a
request may not count its last rounds for this long."""

Key = tuple[str, tuple[tuple[str, str], ...]]
"""A metric series: its name and its sorted labels."""


def series(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


class MetricTally:
    """Counter increments summed per series since the last `drain`, the latest value of each gauge, and
    each histogram's observations."""

    def __init__(self) -> None:
        self._counters: dict[Key, float] = {}
        self._gauges: dict[Key, float] = {}
        self._observations: dict[Key, list[float]] = {}

    def add(self, name: str, value: float, **labels: str) -> None:
        key = series(name, **labels)
        self._counters[key] = self._counters.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        self._gauges[series(name, **labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._observations.setdefault(series(name, **labels), []).append(value)

    def drain(self) -> tuple[dict[Key, float], dict[Key, float], dict[Key, list[float]]]:
        """The counter increments, gauge values and histogram observations gathered since the last
        drain; the tally is empty after."""
        drained = self._counters, self._gauges, self._observations
        self._counters, self._gauges, self._observations = {}, {}, {}
        return drained

    def __bool__(self) -> bool:
        return bool(self._counters or self._gauges or self._observations)

    def observe_round(self, r: Round, mode: str) -> None:
        """What one round (a verification, or one streamed plain token) adds to the vLLM-style counters."""
        for failed in r.failed:
            self.add("minions_ssm_failures", 1, ssm=failed)
        for name, matched in r.ssm_matched().items():
            self.add("minions_ssm_drafts", 1, ssm=name)
            self.add("minions_ssm_draft_tokens", len(r.drafts[name]), ssm=name)
            self.add("minions_ssm_matched_tokens", matched, ssm=name)
        if r.ssm:
            self.add("minions_ssm_chosen", 1, ssm=r.ssm)
        if r.control_seconds:
            self.add("minions_control_seconds", r.control_seconds, speculation=mode)
        ssm = r.ssm or "none"
        self.add("minions_num_rounds", 1, speculation=mode)
        if r.llm_call:
            self.add("minions_num_llm_calls", 1, speculation=mode)
        self.add("minions_spec_decode_num_emitted_tokens", len(r.tokens), ssm=ssm)
        if r.drafted:
            self.add("minions_spec_decode_num_drafts", 1, ssm=ssm)
            self.add("minions_spec_decode_num_draft_tokens", r.drafted, ssm=ssm)
            self.add("minions_spec_decode_num_accepted_tokens", r.accepted, ssm=ssm)
            for pos in range(r.accepted):
                self.add("minions_spec_decode_num_accepted_tokens_per_pos", 1, ssm=ssm, position=str(pos))

    def observe_probe(self, outcome: str) -> None:
        """A plain stream's probe of its drafters ended so (watch.PROBE_OUTCOMES)."""
        self.add("minions_probes", 1, outcome=outcome)

    def observe_request(self, mode: str, outcome: str, seconds: float = 0.0) -> None:
        self.add("minions_requests", 1, speculation=mode, outcome=outcome)
        if seconds:
            self.add("minions_request_seconds", seconds, speculation=mode)

    def observe_latency(self, mode: str, ttft_s: float | None, itl_s: float | None, e2e_s: float) -> None:
        """A finished request's latencies, vLLM's histograms: time to first token, time per output token
        after the first (the request's mean: a verified draft arrives as several tokens at once), and
        end to end."""
        if ttft_s is not None:
            self.observe("minions_time_to_first_token_seconds", ttft_s, speculation=mode)
        if itl_s is not None:
            self.observe("minions_time_per_output_token_seconds", itl_s, speculation=mode)
        self.observe("minions_e2e_request_latency_seconds", e2e_s, speculation=mode)

    def observe_admission(self, running: int, waiting: int, kv_usage: float) -> None:
        """Requests holding a decoding slot, those waiting for one, and how full the KV cache is (vLLM's
        num_requests_running, num_requests_waiting and kv_cache_usage_perc)."""
        self.set("minions_num_requests_running", running)
        self.set("minions_num_requests_waiting", waiting)
        self.set("minions_kv_cache_usage_perc", kv_usage)

    def observe_weights(self, weights: dict[str, float]) -> None:
        for name, weight in weights.items():
            self.set("minions_ssm_weight", weight, ssm=name)
