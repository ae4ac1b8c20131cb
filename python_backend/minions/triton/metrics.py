"""Prometheus metrics on Triton's metrics port, named like vLLM's speculative-decoding metrics."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from ..decode_loop import Round

COUNTERS = {
    "minions_spec_decode_num_drafts": "Verification rounds that carried a non-empty draft",
    "minions_spec_decode_num_draft_tokens": "Draft tokens proposed by SSMs and sent to the LLM",
    "minions_spec_decode_num_accepted_tokens": "Draft tokens the LLM accepted",
    "minions_spec_decode_num_accepted_tokens_per_pos": "Accepted draft tokens by position in the draft",
    "minions_spec_decode_num_emitted_tokens": "Tokens emitted by verification rounds (accepted + the LLM's own)",
    "minions_num_verifications": "LLM calls made by the orchestrator",
    "minions_requests": "Finished requests by speculation mode and outcome",
    "minions_ssm_failures": "SSM calls that failed; the round went on without a draft",
}


class SpeculationMetrics:
    def __init__(self, model: str) -> None:
        self.model = model
        self.families = {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.COUNTER)
            for name, doc in COUNTERS.items()
        }
        self._metrics: dict[tuple, object] = {}

    def _counter(self, name: str, **labels: str):
        key = (name, tuple(sorted(labels.items())))
        metric = self._metrics.get(key)
        if metric is None:
            metric = self.families[name].Metric(labels={"model": self.model, **labels})
            self._metrics[key] = metric
        return metric

    def observe_round(self, r: Round, mode: str) -> None:
        if r.ssm_failed:
            self._counter("minions_ssm_failures", ssm=r.ssm_failed).increment(1)
        ssm = r.ssm or "none"
        self._counter("minions_num_verifications", speculation=mode).increment(1)
        self._counter("minions_spec_decode_num_emitted_tokens", ssm=ssm).increment(len(r.tokens))
        if r.drafted:
            self._counter("minions_spec_decode_num_drafts", ssm=ssm).increment(1)
            self._counter("minions_spec_decode_num_draft_tokens", ssm=ssm).increment(r.drafted)
            self._counter("minions_spec_decode_num_accepted_tokens", ssm=ssm).increment(r.accepted)
            for pos in range(r.accepted):
                self._counter("minions_spec_decode_num_accepted_tokens_per_pos", ssm=ssm, position=str(pos)).increment(1)

    def observe_request(self, mode: str, outcome: str) -> None:
        self._counter("minions_requests", speculation=mode, outcome=outcome).increment(1)
