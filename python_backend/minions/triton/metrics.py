"""Prometheus metrics on Triton's metrics port, named like vLLM's speculative-decoding metrics."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from minions.speculation.rounds import Round

COUNTERS = {
    "minions_spec_decode_num_drafts": "Verification rounds that carried a non-empty draft",
    "minions_spec_decode_num_draft_tokens": "Draft tokens proposed by SSMs and sent to the LLM",
    "minions_spec_decode_num_accepted_tokens": "Draft tokens the LLM accepted",
    "minions_spec_decode_num_accepted_tokens_per_pos": "Accepted draft tokens by position in the draft",
    "minions_spec_decode_num_emitted_tokens": "Tokens emitted by verification rounds (accepted + the LLM's own)",
    "minions_num_verifications": "LLM calls made by the orchestrator",
    "minions_requests": "Finished requests by speculation mode and outcome",
    "minions_ssm_failures": "SSM calls that failed or missed the vote's deadline; the round went on without them",
    "minions_ssm_drafts": "Rounds in which an SSM drafted (under a vote, every SSM asked)",
    "minions_ssm_draft_tokens": "Tokens an SSM drafted, whether or not its draft was the one sent",
    "minions_ssm_matched_tokens": "Tokens of an SSM's own draft that the LLM's output confirmed",
    "minions_ssm_chosen": "Rounds whose verified draft was this SSM's (its path won the vote)",
    "minions_control_seconds": "Time spent voting, updating weights and choosing SSMs",
    "minions_request_seconds": "Wall time of finished requests, for the control-time share",
}
GAUGES = {
    "minions_ssm_weight": "The vote's current global weight of an SSM",
}


class SpeculationMetrics:
    def __init__(self, model: str) -> None:
        self.model = model
        # MetricFamily objects must stay referenced for their metrics to be exported.
        self.families = {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.COUNTER)
            for name, doc in COUNTERS.items()
        } | {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.GAUGE)
            for name, doc in GAUGES.items()
        }
        self._metrics: dict[tuple, object] = {}

    def _metric(self, name: str, **labels: str):
        key = (name, tuple(sorted(labels.items())))
        metric = self._metrics.get(key)
        if metric is None:
            metric = self.families[name].Metric(labels={"model": self.model, **labels})
            self._metrics[key] = metric
        return metric

    def observe_round(self, r: Round, mode: str) -> None:
        for failed in r.failed:
            self._metric("minions_ssm_failures", ssm=failed).increment(1)
        for name, matched in r.ssm_matched().items():
            self._metric("minions_ssm_drafts", ssm=name).increment(1)
            self._metric("minions_ssm_draft_tokens", ssm=name).increment(len(r.drafts[name]))
            self._metric("minions_ssm_matched_tokens", ssm=name).increment(matched)
        if r.ssm:
            self._metric("minions_ssm_chosen", ssm=r.ssm).increment(1)
        if r.control_seconds:
            self._metric("minions_control_seconds", speculation=mode).increment(r.control_seconds)
        ssm = r.ssm or "none"
        self._metric("minions_num_verifications", speculation=mode).increment(1)
        self._metric("minions_spec_decode_num_emitted_tokens", ssm=ssm).increment(len(r.tokens))
        if r.drafted:
            self._metric("minions_spec_decode_num_drafts", ssm=ssm).increment(1)
            self._metric("minions_spec_decode_num_draft_tokens", ssm=ssm).increment(r.drafted)
            self._metric("minions_spec_decode_num_accepted_tokens", ssm=ssm).increment(r.accepted)
            for pos in range(r.accepted):
                self._metric("minions_spec_decode_num_accepted_tokens_per_pos", ssm=ssm, position=str(pos)).increment(1)

    def observe_request(self, mode: str, outcome: str, seconds: float = 0.0) -> None:
        self._metric("minions_requests", speculation=mode, outcome=outcome).increment(1)
        if seconds:
            self._metric("minions_request_seconds", speculation=mode).increment(seconds)

    def observe_weights(self, weights: dict[str, float]) -> None:
        for name, weight in weights.items():
            self._metric("minions_ssm_weight", ssm=name).set(weight)
