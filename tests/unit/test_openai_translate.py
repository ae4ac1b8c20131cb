"""The OpenAI frontend's pure parts: request validation, translation to the `minions` model's inputs,
and the response objects built from its outputs."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import deserialize_bytes_tensor

from minions.frontend.app import openai_error
from minions.frontend.protocol import ChatCompletionRequest, CompletionRequest
from minions.frontend.translate import OPENAI_TEMPERATURE, Generation, chat_inputs, completion_inputs, sse
from minions.frontend.triton_stream import ModelInputs, TritonError


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="minions", messages=[{"role": "user", "content": "Hi"}], **fields)


def test_completion_defaults_are_openais():
    inputs = completion_inputs(CompletionRequest(model="minions", prompt="Hello"))
    assert inputs["text_input"] == "Hello" and inputs["chat"] is False
    assert inputs["max_tokens"] == 16 and inputs["temperature"] == OPENAI_TEMPERATURE == 1.0
    assert inputs["stream"] is True and inputs["exclude_input_in_output"] is True
    assert "seed" not in inputs and "stop_words" not in inputs and "speculation" not in inputs


def test_completion_fields_reach_the_model():
    req = CompletionRequest(model="minions", prompt=["Hello"], max_tokens=5, temperature=0, top_p=0.9, seed=3,
                            stop="\n", speculation="vote", num_draft_tokens=4, top_k=20)
    inputs = completion_inputs(req)
    assert inputs["text_input"] == "Hello" and inputs["max_tokens"] == 5 and inputs["temperature"] == 0
    assert inputs["top_p"] == 0.9 and inputs["seed"] == 3 and inputs["stop_words"] == ["\n"]
    assert inputs["speculation"] == "vote" and inputs["num_draft_tokens"] == 4 and inputs["top_k"] == 20


def test_chat_sends_messages_as_json_for_the_chat_template():
    req = ChatCompletionRequest(model="minions", max_tokens=9, max_completion_tokens=7, messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "there"}]}])
    inputs = chat_inputs(req)
    assert inputs["chat"] is True and inputs["max_tokens"] == 7  # max_completion_tokens wins
    assert json.loads(inputs["text_input"]) == [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "Hello, there"}]
    assert "max_tokens" not in chat_inputs(_chat())  # the server's default


@pytest.mark.parametrize("build, field", [
    (lambda: _chat(n=2), "n"),
    (lambda: _chat(logit_bias={"1": 5.0}), "logit_bias"),
    (lambda: _chat(tools=[{"type": "function"}]), "tools"),
    (lambda: _chat(logprobs=True, top_logprobs=2), "top_logprobs"),
    (lambda: CompletionRequest(model="minions", prompt="a", logprobs=2), "logprobs"),
    (lambda: CompletionRequest(model="minions", prompt="a", logprobs=0, echo=True), "echo"),
    (lambda: _chat(temperature=-0.1), "temperature"),
    (lambda: ChatCompletionRequest(model="minions", messages=[]), "messages"),
    (lambda: ChatCompletionRequest(model="minions", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), "text content"),
    (lambda: CompletionRequest(model="minions", prompt=["a", "b"]), "one prompt"),
    (lambda: CompletionRequest(model="minions", prompt="a", best_of=2), "best_of"),
    (lambda: CompletionRequest(model="minions", prompt="a", max_tokens=0), "max_tokens"),
])
def test_what_minions_cannot_honour_is_refused_naming_it(build, field):
    with pytest.raises(ValidationError, match=field):
        build()


def test_a_chat_answer_and_its_stream():
    gen = Generation("chat.completion", "minions")
    assert gen.id.startswith("chatcmpl-")
    assert gen.add({"text_output": "Hel", "num_output_tokens": 1, "num_input_tokens": 7}) == "Hel"
    gen.add({"text_output": "lo", "num_output_tokens": 2, "num_input_tokens": 7, "num_cached_tokens": 0,
             "finish_reason": "stop"})
    body = gen.body()
    assert body["object"] == "chat.completion" and body["model"] == "minions"
    assert body["choices"] == [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                "message": {"role": "assistant", "content": "Hello"}}]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    first = gen.chunk("", first=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {"role": "assistant",
                                                                                            "content": ""}
    assert gen.chunk(finish_reason="stop")["choices"][0] == {"index": 0, "finish_reason": "stop", "logprobs": None,
                                                            "delta": {}}
    assert gen.usage_chunk()["choices"] == [] and gen.usage_chunk()["usage"]["total_tokens"] == 9


def test_usage_reports_the_prompt_tokens_the_llm_found_cached():
    gen = Generation("chat.completion", "minions")
    gen.add({"text_output": "a", "num_output_tokens": 1, "num_input_tokens": 300, "num_cached_tokens": 256})
    gen.add({"text_output": "b", "num_output_tokens": 2, "num_input_tokens": 300, "num_cached_tokens": 256,
             "finish_reason": "stop"})
    assert gen.body()["usage"]["prompt_tokens_details"] == {"cached_tokens": 256}
    assert gen.usage_chunk()["usage"] == {"prompt_tokens": 300, "completion_tokens": 2, "total_tokens": 302,
                                          "prompt_tokens_details": {"cached_tokens": 256}}


def test_a_completion_answer_echoes_its_prompt_when_asked():
    gen = Generation("text_completion", "minions")
    gen.add({"text_output": " world", "num_output_tokens": 1, "num_input_tokens": 1, "finish_reason": "length"})
    assert gen.id.startswith("cmpl-") and gen.body("Hello")["choices"][0]["text"] == "Hello world"
    assert gen.chunk(" world")["object"] == "text_completion"
    assert sse(gen.chunk("é")).decode().startswith('data: {"id"') and "é" in sse(gen.chunk("é")).decode()
    assert sse("[DONE]") == b"data: [DONE]\n\n"


@pytest.mark.parametrize("code, status", [(grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.UNAVAILABLE, 503),
                                          (grpc.StatusCode.INTERNAL, 500), (grpc.StatusCode.UNKNOWN, 500)])
def test_tritons_status_becomes_the_http_status(code, status):
    error = openai_error(TritonError(code, "the request failed"))
    assert error.status == status and error.body()["error"]["message"] == "the request failed"


def _config() -> service_pb2.ModelConfigResponse:
    config = model_config_pb2.ModelConfig(name="minions", max_batch_size=64)
    config.input.add(name="text_input", data_type=model_config_pb2.TYPE_STRING, dims=[-1])
    config.input.add(name="max_tokens", data_type=model_config_pb2.TYPE_INT32, dims=[1])
    config.input.add(name="temperature", data_type=model_config_pb2.TYPE_FP32, dims=[1])
    config.input.add(name="stop_words", data_type=model_config_pb2.TYPE_STRING, dims=[-1])
    return service_pb2.ModelConfigResponse(config=config)


def test_inputs_take_the_served_models_datatypes_with_a_batch_of_one():
    spec = ModelInputs.of(_config())
    tensor, raw = spec.tensor("max_tokens", 5)
    assert (tensor.datatype, list(tensor.shape)) == ("INT32", [1, 1]) and np.frombuffer(raw, np.int32).tolist() == [5]
    tensor, raw = spec.tensor("temperature", 0.5)
    assert tensor.datatype == "FP32" and np.frombuffer(raw, np.float32).tolist() == [0.5]
    tensor, raw = spec.tensor("text_input", "héllo")
    assert (tensor.datatype, list(tensor.shape)) == ("BYTES", [1, 1])
    assert deserialize_bytes_tensor(raw).tolist() == ["héllo".encode()]
    tensor, raw = spec.tensor("stop_words", ["a", "bc"])
    assert list(tensor.shape) == [1, 2] and deserialize_bytes_tensor(raw).tolist() == [b"a", b"bc"]
    with pytest.raises(KeyError, match="no input 'beam_width'"):
        spec.tensor("beam_width", 1)


def test_log_probs_are_asked_for_and_answered_in_openais_shapes():
    assert chat_inputs(_chat(logprobs=True))["return_log_probs"] is True
    assert "return_log_probs" not in chat_inputs(_chat())
    assert completion_inputs(CompletionRequest(model="minions", prompt="a", logprobs=0))["return_log_probs"] is True
    chat = Generation("chat.completion", "minions", with_log_probs=True)
    chat.add({"text_output": "Hé", "output_tokens": ["H", "é"], "output_log_probs": [-0.5, -1.5]})
    assert chat.new_log_probs == [("H", -0.5), ("é", -1.5)]
    chat.add({"text_output": "!", "output_tokens": "!", "output_log_probs": -0.25})  # one token: a scalar
    content = chat.body()["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"], c["bytes"]) for c in content] == [
        ("H", -0.5, [72]), ("é", -1.5, [195, 169]), ("!", -0.25, [33])]
    assert chat.chunk("!", log_probs=chat.new_log_probs)["choices"][0]["logprobs"]["content"][0]["token"] == "!"
    completion = Generation("text_completion", "minions", with_log_probs=True)
    completion.add({"text_output": " ab", "output_tokens": [" a", "b"], "output_log_probs": [-1.0, -2.0]})
    completion.add({"text_output": "c", "output_tokens": ["c"], "output_log_probs": [-3.0]})
    assert completion.body()["choices"][0]["logprobs"] == {"tokens": [" a", "b", "c"], "top_logprobs": None,
                                                           "token_logprobs": [-1.0, -2.0, -3.0], "text_offset": [0, 2, 3]}
    assert completion.chunk("c", log_probs=completion.new_log_probs)["choices"][0]["logprobs"]["text_offset"] == [3]
    assert Generation("chat.completion", "minions").body()["choices"][0]["logprobs"] is None
