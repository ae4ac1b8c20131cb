"""Triton adapter for every engine model (llm, ssm_*): tensors in, Engine.generate, tensors out."""

from __future__ import annotations

import logging
import time
import uuid

import triton_python_backend_utils as pb_utils

from ..engine_api import encode_engine_outputs, parse_engine_inputs
from ..engines import build_engine
from ..errors import InvalidRequest
from .common import error, input_arrays, model_config, setup_logging, string_parameters

log = logging.getLogger("minions.engine")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        setup_logging()
        config = model_config(args)
        self.name = args["model_name"]
        self.input_names = [i["name"] for i in config["input"]]
        params = string_parameters(config)
        start = time.perf_counter()
        self.engine = build_engine(params)
        log.info("%s: %s engine ready in %.1f s", self.name, params.get("engine"), time.perf_counter() - start)
        # The family must outlive its metrics, so keep a reference to it as well.
        self.cached_family = pb_utils.MetricFamily(
            name="minions_engine_cached_sequences",
            description="Sequences whose state (KV cache or llama.cpp context) an engine holds",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.cached_gauge = self.cached_family.Metric(labels={"model": self.name})

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._run(request))
            except InvalidRequest as exc:
                responses.append(pb_utils.InferenceResponse(error=error(str(exc), pb_utils.TritonError.INVALID_ARG)))
            except Exception as exc:  # a failing request must not take the model down
                log.exception("%s: request failed", self.name)
                responses.append(pb_utils.InferenceResponse(error=error(f"{self.name}: {type(exc).__name__}: {exc}")))
        cache = getattr(self.engine, "cache", None)
        self.cached_gauge.set(len(cache) if cache is not None else 0)
        return responses

    def _run(self, request):
        request_id = request.request_id()
        anonymous = not request_id
        if anonymous:  # no id, no reuse: compute, then free at once
            request_id = f"anonymous-{uuid.uuid4().hex}"
        engine_requests = parse_engine_inputs(input_arrays(request, self.input_names), request_id)
        try:
            results = [self.engine.generate(r) for r in engine_requests]
        finally:
            if anonymous:
                for r in engine_requests:
                    self.engine.release(r.request_id)
        outputs = encode_engine_outputs(engine_requests, results)
        wanted = set(request.requested_output_names() or outputs)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in outputs.items() if name in wanted]
        )

    def finalize(self) -> None:
        log.info("%s: unloaded", self.name)
