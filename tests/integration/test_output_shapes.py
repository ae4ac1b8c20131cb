"""Every output of every response has the shape the served model's config declares (batch dimension
first), as tensorrt_llm and tensorrt_llm_bls send them, streaming or not: `minions` (only text_output
is [1], as tensorrt_llm_bls sends it) and the `llm` engine model."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.helpers import grpc_tensors
from tests.support.model_config import BLS_TEXT_OUTPUT, shape_breaches

PROMPT = "The capital of France is"


def _responses(server, model: str, arrays: dict[str, np.ndarray]) -> list[grpcclient.InferResult]:
    """Every response to one request over the gRPC stream, all outputs (none named, so all come back)."""
    inputs = grpc_tensors(arrays)
    results, errors = [], []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: (errors if error else results).append(error or result))
    try:
        client.async_stream_infer(model, inputs)
    finally:
        client.stop_stream()
        client.close()
    assert not errors and results, errors
    return results


def _breaches(server, model: str, results: list[grpcclient.InferResult], exceptions=None) -> list[dict]:
    config = grpcclient.InferenceServerClient(server.grpc_url).get_model_config(model).config
    return [shape_breaches(config, {o.name: o.shape for o in r.get_response().outputs}, exceptions)
            for r in results]


@pytest.mark.parametrize("streaming", [False, True])
def test_every_output_of_minions_has_its_configured_shape(server, streaming):
    results = _responses(server, "minions", {
        "text_input": np.array([[PROMPT]], dtype=object), "max_tokens": np.array([[8]], np.int32),
        "stream": np.array([[streaming]], bool), "temperature": np.array([[0.0]], np.float32),
        "return_perf_metrics": np.array([[True]], bool), "return_log_probs": np.array([[True]], bool)})
    names = set(o.name for o in results[-1].get_response().outputs)
    assert {"kv_cache_alloc_new_blocks", "draft_lengths", "finish_reason", "output_log_probs"} <= names
    assert len(results) > 1 if streaming else len(results) == 1
    assert _breaches(server, "minions", results, BLS_TEXT_OUTPUT) == [{}] * len(results)


@pytest.mark.parametrize("streaming", [False, True])
def test_every_output_of_the_llm_has_its_configured_shape(server, streaming):
    ids = [504, 3575, 282, 4649, 314]  # any ids of the vocabulary
    results = _responses(server, "llm", {
        "input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[4]], np.int32), "streaming": np.array([[streaming]], bool),
        "return_perf_metrics": np.array([[True]], bool), "return_log_probs": np.array([[True]], bool),
        "return_generation_logits": np.array([[True]], bool)})
    names = set(o.name for o in results[-1].get_response().outputs)
    assert {"output_ids", "generation_logits", "kv_cache_alloc_new_blocks", "cum_log_probs"} <= names
    assert _breaches(server, "llm", results) == [{}] * len(results)
