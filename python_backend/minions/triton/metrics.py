"""Prometheus metrics on Triton's metrics port, named like vLLM's speculative-decoding metrics."""

from __future__ import annotations

import asyncio

import triton_python_backend_utils as pb_utils

from minions.serving.metric_tally import Key, MetricTally

from .common import series_labels

COUNTERS = {
    "minions_spec_decode_num_drafts": "Verification rounds that carried a non-empty draft",
    "minions_spec_decode_num_draft_tokens": "Draft tokens proposed by SSMs and sent to the LLM",
    "minions_spec_decode_num_accepted_tokens": "Draft tokens the LLM accepted",
    "minions_spec_decode_num_accepted_tokens_per_pos": "Accepted draft tokens by position in the draft",
    "minions_spec_decode_num_emitted_tokens": "Tokens emitted by verification rounds (accepted + the LLM's own)",
    "minions_num_rounds": "Rounds of the decode loop: verifications and streamed plain tokens",
    "minions_num_llm_calls": "Calls to the LLM: verifications and streamed stretches of plain tokens",
    "minions_requests": "Finished requests by speculation mode and outcome",
    "minions_probes": ("Probes of a plain stream's drafters by outcome: found (a draft worth verifying), empty, "
                       "priced_out (a draft cut short as not worth its verification's cost at the load), "
                       "cancelled (the stream or request ended first)"),
    "minions_ssm_failures": "SSM calls that failed or missed the vote's deadline; the round went on without them",
    "minions_ssm_drafts": "Rounds in which an SSM drafted (under a vote, every SSM asked)",
    "minions_ssm_draft_tokens": "Tokens an SSM drafted, whether or not its draft was the one sent",
    "minions_ssm_matched_tokens": "Tokens of an SSM's own draft that the LLM's output confirmed",
    "minions_ssm_chosen": "Rounds whose verified draft was this SSM's (its path won the vote)",
    "minions_control_seconds": "Time spent voting, updating weights and choosing SSMs",
    "minions_request_seconds": "Wall time of finished requests, for the control-time share",
    "minions_ssm_reloads": "Times the orchestrator loaded an SSM's model again after its stub died, by outcome",
    "minions_llm_reloads": "Times the orchestrator loaded the LLM's model again after its stub died, by outcome",
}
GAUGES = {
    "minions_ssm_weight": "The vote's current global weight of an SSM",
    "minions_ssm_ready": "1 while Triton reports the SSM's model ready and the orchestrator drafts with it, else 0",
    "minions_llm_ready": "1 while the LLM's model is ready and its stub answers, else 0 (requests are refused)",
    "minions_num_requests_running": "Requests holding a decoding slot (vLLM's num_requests_running)",
    "minions_num_requests_waiting": "Requests waiting for a decoding slot or KV room (vLLM's num_requests_waiting)",
    "minions_kv_cache_usage_perc": ("How full the LLM's KV cache is, 0-1, as admission counts it: the tokens admitted "
                                    "requests may hold over the KV budget (vLLM's kv_cache_usage_perc)"),
}

HISTOGRAMS = {
    "minions_time_to_first_token_seconds": (
        "Time from a request's arrival to its first generated tokens (vLLM's time_to_first_token_seconds)",
        [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
         80.0, 160.0, 640.0]),
    "minions_time_per_output_token_seconds": (
        "A request's mean time per output token after the first (vLLM's time_per_output_token_seconds)",
        [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]),
    "minions_e2e_request_latency_seconds": (
        "Time from a request's arrival to its last response (vLLM's e2e_request_latency_seconds)",
        [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
         960.0, 1920.0]),
}
"""Buckets as vLLM's."""


class SpeculationMetrics:
    """Exports a MetricTally's batches as Triton custom metrics (one pb_utils update per changed series)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.tally = MetricTally()
        # MetricFamily objects must stay referenced for their metrics to be exported.
        self.families = {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.COUNTER)
            for name, doc in COUNTERS.items()
        } | {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.GAUGE)
            for name, doc in GAUGES.items()
        } | {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.HISTOGRAM)
            for name, (doc, _) in HISTOGRAMS.items()
        }
        self._metrics: dict[Key, object] = {}

    def _metric(self, key: Key):
        metric = self._metrics.get(key)
        if metric is None:
            name, labels = key
            buckets = HISTOGRAMS[name][1] if name in HISTOGRAMS else None
            metric = self.families[name].Metric(labels=series_labels(self.model, **dict(labels)), buckets=buckets)
            self._metrics[key] = metric
        return metric

    def flush(self) -> None:
        """Hand what the tally gathered to Triton; a series is created the first time it is seen."""
        counters, gauges, observations = self.tally.drain()
        for key, value in counters.items():
            if value or key not in self._metrics:
                self._metric(key).increment(value)
        for key, value in gauges.items():
            self._metric(key).set(value)
        for key, values in observations.items():
            metric = self._metric(key)
            for value in values:
                metric.observe(value)

    async def flush_every(self, seconds: float) -> None:
        """Flush the tally every `seconds` while the model is loaded (a task on the stub's event loop)."""
        while True:
            await asyncio.sleep(seconds)
            if self.tally:
                self.flush()
