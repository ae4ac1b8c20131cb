"""The GPU deployment (deploy.gpu.yaml) rendered and checked as Triton would read it: every config.pbtxt
parses into Triton's ModelConfig, the TensorRT-LLM models carry tensorrtllm_backend's parameters, and
every request the orchestrator can send such an engine matches that engine's declared inputs (names,
data types, dims), so a TensorRT-LLM engine really can stand where the CPU engines stand."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import np_to_triton_dtype

from minions.decoding.engine_call import EngineRequest
from minions.decoding.penalties import Penalties
from minions.decoding.sampling import SamplingParams, native_seed
from minions.deploy.config import ROOT, load_deployment
from minions.deploy.render import orchestrator_settings, render_repository
from minions.engines.tensors import OWN_INPUTS, OWN_OUTPUTS, build_engine_inputs
from minions.errors import InvalidRequest
from minions.serving.request import parse_generation_request
from minions.settings import EngineSettings, OrchestratorSettings
from minions.text.bad_words import BadWords
from minions.triton.engine_client import TritonEngineClient

GPU_DEPLOY = ROOT / "deploy.gpu.yaml"
TRTLLM_MODELS = ("llm", "ssm_qwen05")


def gpu_deployment(tmp_path: Path) -> Path:
    """deploy.gpu.yaml with its checkpoints pointed at stand-in Hugging Face directories under tmp_path
    (rendering reads only their config.json) and its cache under tmp_path."""
    raw = yaml.safe_load(GPU_DEPLOY.read_text())
    for model in [raw["llm"], *raw["ssms"]]:
        if model["engine"] == "tensorrtllm":
            checkpoint = tmp_path / "hf" / Path(model["source"]).name
            checkpoint.mkdir(parents=True)
            (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
            model["source"] = str(checkpoint)
    raw["cache_dir"] = str(tmp_path / "cache")
    path = tmp_path / "deploy.gpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, model_config_pb2.ModelConfig]:
    """Every model of the rendered GPU repository, parsed as Triton parses config.pbtxt."""
    tmp = tmp_path_factory.mktemp("gpu")
    repo = render_repository(load_deployment(gpu_deployment(tmp)), tmp / "repo")
    return {d.name: text_format.Parse((d / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
            for d in sorted(repo.iterdir())}


def parameter(config: model_config_pb2.ModelConfig, key: str) -> str:
    return config.parameters[key].string_value


def test_every_model_of_the_gpu_deployment_renders_into_a_valid_model_config(rendered):
    assert sorted(rendered) == ["llm", "minions", "ssm_ngram", "ssm_qwen05", "ssm_suffix"]
    for name, config in rendered.items():
        assert config.name == name


@pytest.mark.parametrize("name", TRTLLM_MODELS)
def test_tensorrt_llm_models_are_configured_as_tensorrtllm_backend_serves_them(rendered, tmp_path, name):
    config = rendered[name]
    assert config.backend == "tensorrtllm"
    assert config.model_transaction_policy.decoupled, "the orchestrator streams from in-flight engines"
    assert config.max_batch_size == 64
    assert parameter(config, "gpt_model_type") == "inflight_fused_batching"
    assert parameter(config, "max_beam_width") == "1"
    assert parameter(config, "enable_kv_cache_reuse") == "true"
    assert parameter(config, "gpt_model_path").endswith(f"/cache/trtllm/{name}")
    assert 0 < float(parameter(config, "kv_cache_free_gpu_mem_fraction")) < 1
    assert "model_path" not in config.parameters, "none of the Python engines' settings leak into it"


def test_tensorrt_llm_models_declare_tensorrt_llms_interface_without_our_additions(rendered):
    python_engine, trt = rendered["ssm_ngram"], rendered["llm"]
    ours = {i.name: i for i in python_engine.input}
    assert OWN_INPUTS <= set(ours)
    assert {i.name for i in trt.input} == set(ours) - OWN_INPUTS
    for declared in trt.input:
        assert declared == ours[declared.name]
    assert OWN_OUTPUTS <= {o.name for o in python_engine.output}
    assert list(trt.output) == [o for o in python_engine.output if o.name not in OWN_OUTPUTS]


def test_the_orchestrator_treats_the_tensorrt_llm_models_as_native_decoupled_engines(rendered):
    settings = OrchestratorSettings.from_params({k: v.string_value for k, v in rendered["minions"].parameters.items()})
    assert settings.trtllm_model_names == TRTLLM_MODELS
    assert set(TRTLLM_MODELS) <= set(settings.decoupled_model_names)
    assert settings.ssm_model_names == ("ssm_qwen05", "ssm_ngram", "ssm_suffix")
    assert settings.active_requests_limit == settings.draft_pool == 64, "TensorRT-LLM schedules at most max_batch_size sequences"


PENALISED = Penalties(repetition=1.2, min_tokens=5, prompt_length=3)
ENGINE_CALLS = {
    "plain": EngineRequest("r", [1, 2, 3], 4),
    "verification": EngineRequest("r", [1, 2, 3], 4, draft=[4, 5, 6]),
    "sampled draft with logits": EngineRequest("r", [1, 2, 3], 3, draft=[4, 5], draft_logits=np.zeros((2, 32)),
                                               sampling=SamplingParams(temperature=0.7, top_k=20, top_p=0.9), seed=7),
    "draft asking for logits": EngineRequest("r", [1, 2, 3], 4, return_generation_logits=True, streaming=True),
    "penalties, end id, bad words": EngineRequest("r", [1, 2, 3, 9], 2, penalties=PENALISED, end_id=2,
                                                  bad_words=BadWords([[7, 8]])),
    "log probs": EngineRequest("r", [1, 2, 3], 4, return_log_probs=True),
    "stop": EngineRequest.release("r"),
}


@pytest.mark.parametrize("name", TRTLLM_MODELS)
@pytest.mark.parametrize("call", ENGINE_CALLS)
def test_every_request_the_orchestrator_sends_fits_the_rendered_engine_config(rendered, name, call):
    config = rendered[name]
    declared = {i.name: i for i in config.input}
    for tensor, array in build_engine_inputs(ENGINE_CALLS[call], native=True).items():
        assert tensor in declared, f"{tensor} is not an input of {name}"
        spec = declared[tensor]
        assert model_config_pb2.DataType.Name(spec.data_type) == "TYPE_" + np_to_triton_dtype(array.dtype)
        assert array.shape[0] <= config.max_batch_size
        assert len(array.shape[1:]) == len(spec.dims), (tensor, array.shape, spec.dims)
        assert all(d in (-1, n) for d, n in zip(spec.dims, array.shape[1:])), (tensor, array.shape, spec.dims)
    for required in (i.name for i in config.input if not i.optional):
        assert required in build_engine_inputs(ENGINE_CALLS[call], native=True)


def test_a_native_engine_gets_a_seed_per_call_and_what_is_left_of_min_tokens():
    """TensorRT-LLM's sampler restarts its generator at each call: each call gets a seed of its own,
    derived from the request's and where the call starts; ours key their draws by the request's."""
    ours = build_engine_inputs(ENGINE_CALLS["penalties, end id, bad words"])
    native = build_engine_inputs(ENGINE_CALLS["penalties, end id, bad words"], native=True)
    assert int(ours["prompt_length"][0, 0]) == 3 and "prompt_length" not in native
    assert int(ours["min_tokens"][0, 0]) == 5
    assert int(native["min_tokens"][0, 0]) == 4, "one of the five tokens is already in input_ids"
    seeds = [int(build_engine_inputs(EngineRequest("r", [1] * n, 1, seed=3), native=True)["seed"][0, 0])
             for n in (1, 1, 2)]
    assert seeds[0] == seeds[1] != seeds[2] and native_seed(3, 2) == seeds[2]
    assert int(build_engine_inputs(EngineRequest("r", [1, 1], 1, seed=3))["seed"][0, 0]) == 3


def test_a_tensorrt_llm_verifier_refuses_presence_and_frequency_penalties_but_not_repetition(tmp_path):
    settings = orchestrator_settings(load_deployment(gpu_deployment(tmp_path)))
    text = {"text_input": np.array([[b"hello"]], dtype=object)}
    with pytest.raises(InvalidRequest, match="presence_penalty"):
        parse_generation_request(text | {"presence_penalty": np.array([[0.5]], dtype=np.float32)}, settings)
    request = parse_generation_request(text | {"repetition_penalty": np.array([[1.3]], dtype=np.float32)}, settings)
    assert request.penalties.repetition == pytest.approx(1.3)


def test_a_finished_sequence_is_not_released_in_a_tensorrt_llm_model():
    """TensorRT-LLM keeps no sequence between calls: no `stop` call goes out (no channel is even opened)."""
    client = TritonEngineClient("127.0.0.1:1", frozenset({"llm"}), 1.0, native_models=frozenset({"llm"}))
    asyncio.run(client.release("llm", "r"))
    assert client._service is None


def test_the_cuda_deployment_puts_the_torch_llm_on_the_gpu():
    llm = EngineSettings.from_yaml(load_deployment(ROOT / "deploy.cuda.yaml").llm)
    assert (llm.engine, llm.device, llm.dtype) == ("torch", "cuda", "float32")
