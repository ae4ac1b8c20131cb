"""Prometheus metrics on Triton's metrics port, named like vLLM's speculative-decoding metrics."""

from __future__ import annotations

import asyncio
import dataclasses

import triton_python_backend_utils as pb_utils

from minions.engines.api import BatchStats, Engine, MeteredEngine, PrefixCachingEngine
from minions.engines.prefix_cache import PrefixCacheStats
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

ENGINE_GAUGES = {
    "minions_engine_cached_sequences": "Sequences whose state (KV cache or llama.cpp context) an engine holds",
    "minions_engine_batch_total": ("Engine forward passes, sequences served by them, tokens computed and pad tokens "
                                   "among them"),
    "minions_engine_kv_bytes": "Bytes held by the engine's KV caches (bounded by its kv_budget_mb)",
}
"""An engine's state; the batching totals are gauges that mirror the engine's own counters."""
ENGINE_COUNTERS = {
    "minions_prefix_cache_queries": "Prompt tokens of new sequences looked up in the engine's prefix cache",
    "minions_prefix_cache_hits": "Prompt tokens of new sequences found in the engine's prefix cache (not computed again)",
}
"""vLLM's prefix-cache counters, in tokens."""


def families(table: dict[str, str], kind) -> dict[str, object]:
    """A pb_utils MetricFamily of `kind` per name in `table` (name -> description)."""
    return {name: pb_utils.MetricFamily(name=name, description=doc, kind=kind) for name, doc in table.items()}


class SpeculationMetrics:
    """Exports a MetricTally's batches as Triton custom metrics (one pb_utils update per changed series)."""

    def __init__(self, model: str, engine_gauges: list[EngineGauges] | None = None) -> None:
        self.model = model
        self.tally = MetricTally()
        self.engine_gauges = engine_gauges or []
        """The model's in-process engines' state, observed at each flush."""
        # MetricFamily objects must stay referenced for their metrics to be exported.
        self.families = (families(COUNTERS, pb_utils.MetricFamily.COUNTER) | families(GAUGES, pb_utils.MetricFamily.GAUGE)
                         | families({name: doc for name, (doc, _) in HISTOGRAMS.items()},
                                    pb_utils.MetricFamily.HISTOGRAM))
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
            for gauges in self.engine_gauges:
                gauges.observe()


class EngineGauges:
    """An engine's state mirrored into ENGINE_GAUGES and ENGINE_COUNTERS under its model's name (an engine
    that is not a MeteredEngine holds no sequence). Each update is a round trip to tritonserver, so
    `observe` sends only what changed; it is called from one thread at a time."""

    def __init__(self, model: str, engine: Engine) -> None:
        self.engine = engine
        # MetricFamily objects must stay referenced for their metrics to be exported.
        self.families = (families(ENGINE_GAUGES, pb_utils.MetricFamily.GAUGE)
                         | families(ENGINE_COUNTERS, pb_utils.MetricFamily.COUNTER))
        labels = series_labels(model)
        self.series = {
            "cached": self.families["minions_engine_cached_sequences"].Metric(labels=labels),
            "kv": self.families["minions_engine_kv_bytes"].Metric(labels=labels),
        } | {
            f"batch_{f.name}": self.families["minions_engine_batch_total"].Metric(
                labels=series_labels(model, what=f.name)) for f in dataclasses.fields(BatchStats)
        } | {
            f"prefix_{f.name}": self.families[f"minions_prefix_cache_{f.name}"].Metric(labels=labels)
            for f in dataclasses.fields(PrefixCacheStats)
        }
        self._exported: dict[str, float] = {}
        """The value each gauge was last set to, and each counter's total when last increased."""

    def observe(self) -> None:
        values: dict[str, float] = {"cached": 0}
        if isinstance(self.engine, MeteredEngine):
            values["cached"] = len(self.engine.cache)
            values |= {f"batch_{k}": v for k, v in dataclasses.asdict(self.engine.stats).items()}
            if (kv_bytes := self.engine.cached_bytes()) is not None:
                values["kv"] = kv_bytes
        for key, value in values.items():
            if self._exported.get(key) != value:
                self.series[key].set(value)
                self._exported[key] = value
        if isinstance(self.engine, PrefixCachingEngine):
            for what, value in dataclasses.asdict(self.engine.prefix_stats).items():
                key = f"prefix_{what}"
                if (delta := value - self._exported.get(key, 0)) > 0:
                    self.series[key].increment(delta)
                    self._exported[key] = value
