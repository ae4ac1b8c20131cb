"""Requests shaped as tensorrtllm_backend's end-to-end gRPC client sends them to `tensorrt_llm_bls`
(its inputs with their shapes and dtypes, the outputs it asks for) reach `minions` unchanged: served
exactly as `off` when greedy, refused with a clear error for what Minions does not do."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import COPY_PROMPT, grpc_tensors, metric_above, metric_value, wait_until

PROMPT = "What is the capital of France?"
PERF_OUTPUTS = ["kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"]


def _inputs(streaming: bool, temperature: float = 0.0, perf: bool = True, **extra) -> list[grpcclient.InferInput]:
    """What end_to_end_grpc_client.prepare_inputs builds with its defaults (and --return-perf-metrics)."""
    arrays = {
        "text_input": np.array([[PROMPT]]).astype(object),
        "max_tokens": np.ones((1, 1), dtype=np.int32) * 24,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
        "num_return_sequences": np.array([[1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
        **({"return_perf_metrics": np.array([[True]], dtype=bool)} if perf else {}),
        **extra,
    }
    return grpc_tensors(arrays)


def _outputs(perf: bool = True) -> list[grpcclient.InferRequestedOutput]:
    names = ["text_output", "sequence_index", "batch_index"] + (PERF_OUTPUTS if perf else [])
    return [grpcclient.InferRequestedOutput(n) for n in names]


def _stream(server, inputs, outputs, model: str = "minions") -> tuple[list, list]:
    results, errors = [], []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: (errors if error else results).append(error or result))
    try:
        client.async_stream_infer(model, inputs, outputs=outputs, request_id="e2e-1")
    finally:
        client.stop_stream()
        client.close()
    return results, errors


@pytest.mark.parametrize("streaming", [False, True])
def test_the_end_to_end_clients_request_is_served_exactly(server, streaming):
    off = generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(max_tokens=24, speculation="off"))
    results, errors = _stream(server, _inputs(streaming), _outputs())
    assert not errors, errors
    texts = [r.as_numpy("text_output").reshape(-1)[0].decode() for r in results]
    text = "".join(texts)
    assert text == (off.text if streaming else PROMPT + off.text)
    last = results[-1]
    assert last.as_numpy("batch_index").reshape(-1)[0] == 0 and last.as_numpy("sequence_index").reshape(-1)[0] == 0
    times = [int(last.as_numpy(n).reshape(-1)[0]) for n in
             ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")]
    assert times == sorted(times) and times[0] > 0
    assert last.as_numpy("kv_cache_alloc_total_blocks").reshape(-1)[0] >= 1


def test_its_default_sampling_request_is_served(server):
    """The client's default temperature is 1.0 (sampling)."""
    results, errors = _stream(server, _inputs(True, temperature=1.0, perf=False), _outputs(perf=False))
    assert not errors and results


@pytest.mark.parametrize("name, array, message", [
    ("beam_width", np.array([[2]], dtype=np.int32), "beam search is not supported"),
    ("repetition_penalty", np.array([[0.0]], dtype=np.float32), "'repetition_penalty' must be > 0"),
    ("lora_task_id", np.array([[7]], dtype=np.uint64), "LoRA adapters are not supported"),
])
def test_what_minions_does_not_do_is_refused_with_a_clear_error(server, name, array, message):
    results, errors = _stream(server, _inputs(True, **{name: array}), _outputs())
    assert errors and message in str(errors[0]), (results, errors)
    assert "unexpected inference input" not in str(errors[0])


# -- inflight_batcher_llm_client.py against the `llm` engine model, as against a tensorrt_llm model ------

IFB_OUTPUTS = ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits",
               "generation_logits", "batch_index", "sequence_index"]
"""Every output the in-flight batcher client may ask for (--requested-outputs) that has no perf flag."""


def _ifb_inputs(ids: list[int], streaming: bool, end_id: int, **extra) -> list[grpcclient.InferInput]:
    """What inflight_batcher_llm_client.prepare_inputs builds with its defaults (top_k 1: greedy)."""
    return grpc_tensors({
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[16]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "streaming": np.array([[streaming]], dtype=bool),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[end_id]], dtype=np.int32),
        "runtime_top_k": np.array([[1]], dtype=np.int32),
        "runtime_top_p": np.array([[0.0]], dtype=np.float32),
        "return_log_probs": np.array([[False]], dtype=bool),
        "return_context_logits": np.array([[False]], dtype=bool),
        "return_generation_logits": np.array([[False]], dtype=bool),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
        **extra,
    })


@pytest.fixture(scope="module")
def tokenizer(server):
    from transformers import AutoTokenizer

    from minions.deploy.artifacts import tokenizer_dir_for

    return AutoTokenizer.from_pretrained(tokenizer_dir_for(server.deployment.llm["source"], server.deployment),
                                         local_files_only=True)


def _ifb_tokens(server, tokenizer, streaming: bool, **extra) -> list[int]:
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    outputs = [grpcclient.InferRequestedOutput(n) for n in IFB_OUTPUTS]
    results, errors = _stream(server, _ifb_inputs(ids, streaming, tokenizer.eos_token_id, **extra), outputs, "llm")
    assert not errors, errors
    tokens = []
    for r in results:
        n = int(r.as_numpy("sequence_length").reshape(-1)[0])
        tokens += r.as_numpy("output_ids").reshape(-1)[:n].tolist()
        assert r.as_numpy("batch_index").reshape(-1)[0] == 0 and r.as_numpy("sequence_index").reshape(-1)[0] == 0
    assert len(results) == (len(tokens) if streaming else 1)
    return tokens


@pytest.mark.parametrize("streaming", [False, True])
def test_the_inflight_batcher_clients_request_to_llm_is_greedy_decoding(server, tokenizer, streaming):
    """Its default request, over the gRPC stream a decoupled tensorrt_llm model takes, streaming or not:
    the llm's greedy tokens are those `minions` decodes with speculation off."""
    off = generate_grpc(server.grpc_url, "minions", PROMPT, GenerationParams(max_tokens=16, speculation="off"))
    tokens = _ifb_tokens(server, tokenizer, streaming)
    assert tokenizer.decode(tokens, skip_special_tokens=True) == off.text


def test_a_clients_whole_requests_end_their_sequences_and_share_the_prefix_cache(server, tokenizer):
    """A tensorrt_llm client's request names no sequence to continue: once answered its sequence ends
    (the LLM holds no live one for it) and stays as a prefix, which the same prompt sent again reuses."""
    hits = metric_value(server.metrics_url, "minions_prefix_cache_hits", model="llm")
    first, again = (_ifb_tokens(server, tokenizer, False) for _ in range(2))
    assert first == again
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    assert metric_above(server.metrics_url, "minions_prefix_cache_hits", hits + len(ids) - 2, model="llm") \
        >= hits + len(ids) - 1
    wait_until(lambda: metric_value(server.metrics_url, "minions_engine_cached_sequences", model="llm") == 0,
               timeout=20, what="no live sequence left in the LLM")


def test_whole_requests_sharing_a_request_id_are_each_decoded_whole(server, tokenizer):
    """tensorrtllm_backend's clients send a fixed request id (the end-to-end client "e2e-1" here, as
    `_stream` does); an id names no sequence, so requests that share one, at once or one right after
    another, are each decoded whole. Keyed by the id, a finished request's sequence release (sent after
    its answer) ended the next one's stream early: a 0-token or short answer."""
    from concurrent.futures import ThreadPoolExecutor

    whole = {"min_tokens": np.array([[16]], dtype=np.int32)}
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: _ifb_tokens(server, tokenizer, True, **whole), range(12)))
    assert all(len(tokens) == 16 for tokens in answers), [len(tokens) for tokens in answers]
    assert all(tokens == answers[0] for tokens in answers)


def test_the_llm_answers_perf_metrics_to_the_inflight_batcher_client(server, tokenizer):
    """--return-perf-metrics: the perf outputs come with every streamed response, in order."""
    ids = tokenizer.encode(COPY_PROMPT, add_special_tokens=False)
    names = IFB_OUTPUTS + PERF_OUTPUTS
    results, errors = _stream(server, _ifb_inputs(ids, True, tokenizer.eos_token_id,
                                                  return_perf_metrics=np.array([[True]], dtype=bool)),
                              [grpcclient.InferRequestedOutput(n) for n in names], "llm")
    assert not errors and len(results) > 1, errors
    last = results[-1]
    times = [int(last.as_numpy(n).reshape(-1)[0]) for n in
             ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")]
    assert times == sorted(times) and times[0] > 0 and times[3] > times[2]
    assert last.as_numpy("kv_cache_alloc_total_blocks").reshape(-1)[0] == 1  # prompt and 16 tokens: one block
    assert last.as_numpy("total_draft_tokens").reshape(-1)[0] == 0


def test_penalties_sent_to_llm_and_to_minions_decode_alike(server, tokenizer):
    """repetition, presence and frequency penalties and min_tokens are applied by the llm: the in-flight
    batcher client's request and `minions` (off, and speculating) give the same text, which they change."""
    penalties = {"repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.3}
    extra = {name: np.array([[v]], dtype=np.float32) for name, v in penalties.items()}
    tokens = _ifb_tokens(server, tokenizer, True, **extra, min_tokens=np.array([[16]], dtype=np.int32))
    plain = _ifb_tokens(server, tokenizer, True)
    assert tokens != plain and len(tokens) == 16
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    for speculation in ("off", "vote"):
        inputs = _inputs(True, perf=False, max_tokens=np.array([[16]], dtype=np.int32),
                         exclude_input_in_output=np.array([[True]], dtype=bool),
                         min_tokens=np.array([[16]], dtype=np.int32),
                         speculation=np.array([[speculation]]).astype(object), **extra)
        results, errors = _stream(server, inputs, _outputs(perf=False))
        assert not errors, errors
        assert "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in results) == text, speculation


@pytest.mark.parametrize("name, array, message", [
    ("beam_width", np.array([[2]], dtype=np.int32), "beam search is not supported: send beam_width 1"),
    ("return_context_logits", np.array([[True]], dtype=bool), "send return_context_logits false"),
    ("lora_task_id", np.array([[7]], dtype=np.uint64), "LoRA adapters are not supported"),
])
def test_what_the_llm_does_not_do_is_refused_with_a_clear_error(server, tokenizer, name, array, message):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    results, errors = _stream(server, _ifb_inputs(ids, True, tokenizer.eos_token_id, **{name: array}), None, "llm")
    assert errors and message in str(errors[0]), (results, errors)


def test_log_probs_from_minions_and_from_llm_are_the_llms_own(server, tokenizer):
    """return_log_probs: `minions` answers cum_log_probs and output_log_probs, the same under speculation
    as without (the LLM's raw log probabilities at each emitted token), and `llm` answers them to the
    in-flight batcher client for the same tokens."""
    streams = {}
    for speculation in ("off", "vote"):
        inputs = _inputs(False, perf=False, max_tokens=np.array([[16]], dtype=np.int32),
                         return_log_probs=np.array([[True]], dtype=bool), text_input=np.array([[COPY_PROMPT]], object),
                         speculation=np.array([[speculation]]).astype(object))
        names = ("text_output", "num_output_tokens", "cum_log_probs", "output_log_probs")
        results, errors = _stream(server, inputs, [grpcclient.InferRequestedOutput(n) for n in names])
        assert not errors and len(results) == 1, errors
        assert results[0].as_numpy("num_output_tokens").reshape(-1)[0] == 16
        streams[speculation] = (results[0].as_numpy("output_log_probs").reshape(-1),
                                float(results[0].as_numpy("cum_log_probs").reshape(-1)[0]))
    (off, off_cum), (vote, vote_cum) = streams["off"], streams["vote"]
    assert len(off) == 16 and np.all(off <= 0) and off_cum == pytest.approx(off.sum(), abs=1e-3)
    np.testing.assert_allclose(vote, off, atol=1e-2)  # llama.cpp: verification batches round differently
    assert vote_cum == pytest.approx(off_cum, abs=1e-2)
    ids = tokenizer.encode(COPY_PROMPT, add_special_tokens=False)
    results, errors = _stream(server, _ifb_inputs(ids, False, tokenizer.eos_token_id,
                                                  return_log_probs=np.array([[True]], dtype=bool)), None, "llm")
    assert not errors, errors
    np.testing.assert_allclose(results[0].as_numpy("output_log_probs").reshape(-1), off, atol=1e-2)
    assert results[0].as_numpy("cum_log_probs").reshape(-1)[0] == pytest.approx(off_cum, abs=1e-2)
