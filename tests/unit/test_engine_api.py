"""minions.engines.tensors: the tensorrt_llm tensor interface between the orchestrator and every engine."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.decoding.penalties import Penalties
from minions.decoding.sampling import SamplingParams
from minions.engines.compat import ENGINE_NEUTRAL_ONLY, ENGINE_NO_EFFECT, ENGINE_UNSUPPORTED
from minions.engines.tensors import (
    ENGINE_INPUTS,
    CallTimes,
    build_engine_inputs,
    decode_engine_outputs,
    encode_engine_outputs,
    parse_engine_inputs,
)
from minions.errors import InvalidRequest
from minions.text.bad_words import BadWords
from tests.support.model_config import shape_breaches, template_config


def ids(values) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def fields(request: EngineRequest) -> dict:
    """All fields, with BadWords (no __eq__) replaced by its word lists."""
    out = dataclasses.asdict(dataclasses.replace(request, bad_words=BadWords([])))
    out["bad_words"] = request.bad_words.words
    return out


FULL = EngineRequest(
    request_id="req-1",
    input_ids=[5, 9, 2, 7],
    request_output_len=4,
    draft=[3, 3, 1],
    sampling=SamplingParams(temperature=0.75, top_k=20, top_p=0.5),  # exactly representable in float32
    seed=2**64 - 3,
    end_id=2,
    pad_id=11,
    bad_words=BadWords([[4, 5], [6]]),
    penalties=Penalties(repetition=1.25, presence=0.5, frequency=-0.25, min_tokens=3, prompt_length=2),
    return_log_probs=True,
    return_generation_logits=True,
    exclude_input_in_output=True,
)


@pytest.mark.parametrize(
    "request_",
    [
        FULL,
        EngineRequest("plain", [1, 2, 3], 8),
        EngineRequest("sampled", [1], 1, sampling=SamplingParams(temperature=1.5), seed=0),
        EngineRequest("stop", [1, 2], 1, stop=True),
    ],
    ids=["full", "plain", "sampled", "stop"],
)
def test_build_then_parse_round_trip(request_):
    tensors = build_engine_inputs(request_)
    for name, array in tensors.items():
        dtype, dims = ENGINE_INPUTS[name]
        assert array.dtype == dtype, name
        assert array.shape[0] == 1 and array.ndim == len(dims) + 1, f"{name}: batch dim then config dims"
    (parsed,) = parse_engine_inputs(tensors, request_.request_id)
    assert fields(parsed) == fields(request_)


def test_batched_rows_parse_independently():
    """Triton batches two sequences: ids padded to the longer one, each row has its own length."""
    a = EngineRequest("x", [1, 2, 3, 4, 5], 2, sampling=SamplingParams(temperature=0.5), seed=1, end_id=2)
    b = EngineRequest("x", [7, 8], 3, sampling=SamplingParams(), seed=2, end_id=2)
    ta, tb = build_engine_inputs(a), build_engine_inputs(b)
    width = ta["input_ids"].shape[1]
    tb["input_ids"] = np.pad(tb["input_ids"], ((0, 0), (0, width - tb["input_ids"].shape[1])), constant_values=0)
    batched = {name: np.concatenate([ta[name], tb[name]]) for name in ta}
    ra, rb = parse_engine_inputs(batched, "x")
    assert (ra.request_id, rb.request_id) == ("x/0", "x/1")
    assert ra.input_ids == a.input_ids and rb.input_ids == b.input_ids, "padding must not leak into input_ids"
    assert (ra.request_output_len, rb.request_output_len) == (2, 3)
    assert (ra.seed, rb.seed) == (1, 2)
    assert ra.sampling == a.sampling and rb.sampling == b.sampling


def test_defaults_when_optional_inputs_are_absent():
    (r,) = parse_engine_inputs({"input_ids": np.array([[4, 5, 6]], dtype=np.int32)}, "r")
    assert r.input_ids == [4, 5, 6]
    assert r.request_output_len == 1 and r.draft == []
    assert r.sampling == SamplingParams() and r.seed is None and r.end_id is None and r.pad_id == 0
    assert not r.bad_words and not r.stop


def test_output_len_defaults_to_draft_plus_one():
    tensors = {"input_ids": ids([[1, 2]]), "draft_input_ids": ids([[3, 4, 5]])}
    (r,) = parse_engine_inputs(tensors, "r")
    assert r.draft == [3, 4, 5] and r.request_output_len == 4


def test_seed_alias():
    tensors = build_engine_inputs(EngineRequest("r", [1], 1))
    tensors["seed"] = np.array([[77]], dtype=np.uint64)
    assert parse_engine_inputs(tensors, "r")[0].seed == 77


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({}, "'input_ids' is required"),
        ({"input_ids": ids([1, 2])}, r"must be \[batch, len\], got shape \[2\]"),
        ({"input_ids": ids([[1, 2]]), "input_lengths": ids([[3]])}, "'input_lengths' 3 does not fit"),
        ({"input_ids": ids([[1, 2]]), "input_lengths": ids([[0]])}, "'input_lengths' 0 does not fit"),
        ({"input_ids": ids([[1]]), "request_output_len": ids([[0]])}, "'request_output_len' must be >= 1, got 0"),
    ],
)
def test_parse_errors(tensors, message):
    with pytest.raises(InvalidRequest, match=message):
        parse_engine_inputs(tensors, "r")


def test_stop_request_may_ask_for_zero_tokens():
    tensors = {
        "input_ids": np.array([[1]], dtype=np.int32),
        "request_output_len": np.array([[0]], dtype=np.int32),
        "stop": np.array([[True]]),
    }
    assert parse_engine_inputs(tensors, "r")[0].stop


def test_encode_outputs_with_input_and_padding():
    requests = [EngineRequest("a", [1, 2, 3], 2, pad_id=9), EngineRequest("b", [4], 2, pad_id=8)]
    results = [EngineResult([5, 6]), EngineResult([7])]
    out = encode_engine_outputs(requests, results)
    assert out["output_ids"].dtype == np.int32 and out["output_ids"].shape == (2, 1, 5)
    np.testing.assert_array_equal(out["output_ids"][:, 0], [[1, 2, 3, 5, 6], [4, 7, 8, 8, 8]])
    np.testing.assert_array_equal(out["sequence_length"], [[5], [2]])
    assert "generation_logits" not in out


def test_encode_outputs_excluding_input():
    requests = [
        EngineRequest("a", [1, 2, 3], 2, exclude_input_in_output=True),
        EngineRequest("b", [4], 3, exclude_input_in_output=True, pad_id=0),
    ]
    out = encode_engine_outputs(requests, [EngineResult([5]), EngineResult([6, 7, 8])])
    assert out["output_ids"].shape == (2, 1, 3)
    np.testing.assert_array_equal(out["output_ids"][:, 0], [[5, 0, 0], [6, 7, 8]])
    np.testing.assert_array_equal(out["sequence_length"], [[1], [3]])


@pytest.mark.parametrize("exclude", [False, True])
def test_a_streamed_response_holds_only_the_new_tokens(exclude):
    """As tensorrt_llm streams: each response of a streaming call carries the tokens made since the one
    before, never the input, whatever exclude_input_in_output says (a client puts the prompt in front
    itself), and the orchestrator reads them back so."""
    q = EngineRequest("a", [1, 2, 3], 4, streaming=True, exclude_input_in_output=exclude, pad_id=0)
    for result in (EngineResult([7], final=False), EngineResult([8, 9])):
        out = encode_engine_outputs([q], [result])
        assert out["output_ids"].tolist() == [[result.tokens]]
        assert out["sequence_length"].tolist() == [[len(result.tokens)]]
        assert decode_engine_outputs(q, out).tokens == result.tokens
    empty = encode_engine_outputs([q], [EngineResult([])])  # a final response after every token streamed
    assert empty["output_ids"].shape == (1, 1, 0) and empty["sequence_length"].tolist() == [[0]]


@pytest.mark.parametrize("streaming", [False, True])
def test_every_output_has_the_shape_the_engine_config_declares(streaming):
    """[batch, the config's dims] for each output an engine model sends (the shared tensorrt_llm block)."""
    config = template_config("llamacpp")
    requests = [EngineRequest(r, [1, 2], 3, streaming=streaming, return_log_probs=True, return_perf_metrics=True,
                              return_generation_logits=True) for r in ("a", "b")]
    results = [EngineResult([4, 5], logits=np.zeros((2, 6), np.float32), log_probs=[-1.0, -2.0]),
               EngineResult([6], logits=np.zeros((1, 6), np.float32), log_probs=[-3.0])]
    out = encode_engine_outputs(requests, results, CallTimes(1, 2, 3))
    assert {"cum_log_probs", "generation_logits", "kv_cache_reused_blocks", "acceptance_rate"} <= set(out)
    assert shape_breaches(config, {n: a.shape for n, a in out.items()}) == {}
    assert all(a.shape[0] == 2 for a in out.values())


def test_encode_generation_logits():
    logits = np.arange(2 * 4, dtype=np.float32).reshape(2, 4)
    requests = [EngineRequest("a", [1], 2, return_generation_logits=True), EngineRequest("b", [1], 1)]
    out = encode_engine_outputs(requests, [EngineResult([2, 3], logits=logits), EngineResult([4])])
    assert out["generation_logits"].shape == (2, 1, 2, 4)
    np.testing.assert_array_equal(out["generation_logits"][0, 0], logits)
    np.testing.assert_array_equal(out["generation_logits"][1], 0.0)


def test_encode_then_read_back_tokens():
    """What the orchestrator does with an engine's answer: sequence_length tells how much of a padded row is real."""
    q = EngineRequest("a", [1, 2], 3, exclude_input_in_output=True, pad_id=0)
    out = encode_engine_outputs([q], [EngineResult([0, 5, 0])])
    n = int(out["sequence_length"][0, 0])
    assert out["output_ids"][0, 0, :n].tolist() == [0, 5, 0], "pad ids inside the real output are kept"


def test_bad_words_tensor_survives_the_batch_dimension():
    bad = BadWords([[10, 11, 12], [13]])
    tensors = build_engine_inputs(EngineRequest("r", [1, 2], 1, bad_words=bad))
    assert tensors["bad_words_list"].shape == (1, 2, 4)
    assert parse_engine_inputs(tensors, "r")[0].bad_words.words == bad.words


def test_engine_configs_declare_exactly_the_interface_the_code_speaks():
    """The engine models' config.pbtxt and engines/tensors.py must not drift apart: same input names,
    dtypes and dims. Every engine template takes its inputs from the one shared file."""
    import re

    from minions.deploy.config import TEMPLATE_BY_ENGINE
    from minions.deploy.render import TEMPLATES, TENSORRT_LLM_IO

    for model in set(TEMPLATE_BY_ENGINE.values()) - {"tensorrt_llm"}:
        assert "${tensorrt_llm_io}" in (TEMPLATES / model / "config.pbtxt").read_text(), model
    text = TENSORRT_LLM_IO.read_text()
    inputs_block = text[text.index("input ["): text.index("output [")]
    declared = {
        name: (dtype, [int(d) for d in dims.replace(" ", "").split(",")])
        for name, dtype, dims in re.findall(r'name: "(\w+)"\s+data_type: TYPE_(\w+)\s+dims: \[([^\]]*)\]', inputs_block)
    }
    numpy_of = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}
    assert {n: (numpy_of[t], d) for n, (t, d) in declared.items() if n in ENGINE_INPUTS} == ENGINE_INPUTS
    handled = {*ENGINE_INPUTS, *ENGINE_UNSUPPORTED, *ENGINE_NEUTRAL_ONLY, *ENGINE_NO_EFFECT}
    assert set(declared) == handled, "every declared input is used, refused or accepted as having no effect"
    assert len(declared) == 62, "tensorrt_llm's 60 inputs (c2e65b8) plus random_seed and prompt_length"


def test_what_a_tensorrt_llm_client_sends_by_default_is_accepted_and_the_rest_refused():
    """inflight_batcher_llm_client.py's defaults reach the engine; what it cannot honour says what to send."""
    one = lambda v, dtype: np.array([[v]], dtype=dtype)  # noqa: E731
    base = {"input_ids": np.array([[1, 2, 3]], dtype=np.int32), "input_lengths": one(3, np.int32),
            "request_output_len": one(4, np.int32), "beam_width": one(1, np.int32), "temperature": one(1.0, np.float32),
            "streaming": one(False, bool), "end_id": one(2, np.int32), "pad_id": one(2, np.int32),
            "runtime_top_k": one(1, np.int32), "runtime_top_p": one(0.0, np.float32),
            "len_penalty": one(1.2, np.float32),
            "return_log_probs": one(False, bool), "return_context_logits": one(False, bool),
            "retention_decode_priority": one(50, np.int32)}
    [request] = parse_engine_inputs(base, "r")
    assert request.input_ids == [1, 2, 3] and request.sampling.greedy
    for name, value, message in [("beam_width", one(2, np.int32), "beam search is not supported: send beam_width 1"),
                                 ("num_return_sequences", one(3, np.int32), "send num_return_sequences 1"),
                                 ("return_context_logits", one(True, bool), "send return_context_logits false"),
                                 ("lora_task_id", one(4, np.uint64), "LoRA adapters are not supported"),
                                 ("stop_words_list", np.array([[[5], [1]]], dtype=np.int32), "stop words"),
                                 ("repetition_penalty", one(0.0, np.float32), "must be > 0")]:
        with pytest.raises(InvalidRequest, match=message):
            parse_engine_inputs({**base, name: value}, "r")


def test_a_batch_of_neutral_values_is_accepted():
    ids = np.array([[1, 2], [3, 4]], dtype=np.int32)
    requests = parse_engine_inputs({"input_ids": ids, "beam_width": np.array([[1], [1]], dtype=np.int32)}, "r")
    assert [r.input_ids for r in requests] == [[1, 2], [3, 4]]
    with pytest.raises(InvalidRequest, match="is 2"):
        parse_engine_inputs({"input_ids": ids, "beam_width": np.array([[1], [2]], dtype=np.int32)}, "r")


def test_log_probs_travel_as_cum_and_output_log_probs():
    requests = [EngineRequest("a", [1], 3, return_log_probs=True), EngineRequest("b", [1], 3, return_log_probs=True)]
    out = encode_engine_outputs(requests, [EngineResult([4, 5], log_probs=[-0.5, -1.0]),
                                           EngineResult([6], log_probs=[-2.0])])
    assert out["output_log_probs"].shape == (2, 1, 2) and out["cum_log_probs"].shape == (2, 1)
    np.testing.assert_allclose(out["cum_log_probs"], [[-1.5], [-2.0]])
    assert decode_engine_outputs(requests[1], {k: v[1:] for k, v in out.items()}).log_probs == [-2.0]
    with pytest.raises(InvalidRequest, match="no log probabilities"):
        encode_engine_outputs(requests[:1], [EngineResult([4])])  # an n-gram engine has no logits


def test_the_cached_tokens_an_engine_reports_reach_the_orchestrator_every_one():
    """build → parse → encode → decode, as a call of the orchestrator's crosses Triton."""
    request = EngineRequest("a", list(range(300)), 1, return_perf_metrics=True)
    parsed = parse_engine_inputs(build_engine_inputs(request), "a")
    assert parsed[0].return_perf_metrics
    out = encode_engine_outputs(parsed, [EngineResult([5], cached_tokens=299)], CallTimes(1, 2, 3))
    assert out["kv_cache_reused_blocks"].tolist() == [[2]] and out["num_cached_tokens"].tolist() == [[299]]
    assert decode_engine_outputs(request, out).cached_tokens == 299
    assert "return_perf_metrics" not in build_engine_inputs(request, native=True), "TensorRT-LLM's model: not asked"


def test_perf_outputs_report_times_kv_blocks_and_acceptance():
    requests = [EngineRequest("a", list(range(200)), 4, draft=[7, 8, 9], return_perf_metrics=True),
                EngineRequest("b", [1, 2], 1, return_perf_metrics=True)]
    results = [EngineResult([7, 8, 5], cached_tokens=130), EngineResult([3])]
    out = encode_engine_outputs(requests, results, CallTimes(10, 20, 30))
    assert out["kv_cache_alloc_total_blocks"].tolist() == [[2], [1]]  # 203 and 3 tokens in blocks of 128
    assert out["kv_cache_reused_blocks"].tolist() == [[1], [0]]
    assert out["num_cached_tokens"].tolist() == [[130], [0]]
    assert out["kv_cache_alloc_new_blocks"].tolist() == [[1], [1]]
    assert out["total_draft_tokens"].tolist() == [[3], [0]]
    assert out["total_accepted_draft_tokens"].tolist() == [[2], [0]]
    np.testing.assert_allclose(out["acceptance_rate"], [[2 / 3], [0.0]])
    assert [out[k][0, 0] for k in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                   "last_token_time_ns")] == [10, 10, 20, 30]
    streamed = encode_engine_outputs(requests[1:], [EngineResult([3])], CallTimes(1, 2, 3, generated=(300,)))
    assert streamed["kv_cache_alloc_total_blocks"].tolist() == [[3]]  # 2 + 300 tokens so far
