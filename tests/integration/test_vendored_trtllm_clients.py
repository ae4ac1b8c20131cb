"""tensorrtllm_backend's own clients (tests/vendor/tensorrtllm_backend, unmodified) against Minions:
end_to_end_grpc_client.py against `minions` as against tensorrt_llm_bls, inflight_batcher_llm_client.py
against `llm` as against tensorrt_llm, each giving greedy decoding's text."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.api import GenerationParams, generate_grpc
from minions.deploy.artifacts import tokenizer_dir_for
from harness.triton_process import ROOT

VENDOR = ROOT / "tests" / "vendor" / "tensorrtllm_backend"
PROMPT = "The capital of France is"
OUTPUT_LEN = 16
PERF_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


@pytest.fixture(scope="module")
def greedy_text(server) -> str:
    """What `minions` decodes for PROMPT with speculation off: greedy decoding by the LLM."""
    return generate_grpc(server.grpc_url, "minions", PROMPT,
                         GenerationParams(max_tokens=OUTPUT_LEN, speculation="off", temperature=0.0)).text


# -- end_to_end_grpc_client.py against `minions` ------------------------------------------------------

def _vendored(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"vendored_{name}", VENDOR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def end_to_end(url: str, streaming: bool, perf: bool) -> tuple[list[str], str]:
    """The end-to-end client's main, with `--model-name minions --temperature 0 -o 16` and `--streaming`
    and `--return-perf-metrics` as asked: its run_inference called with every argument main passes (its
    --model-name takes only ensemble and tensorrt_llm_bls, so the script itself cannot name `minions`).
    Returns the output texts and what it printed."""
    client_module = _vendored("end_to_end_grpc_client")
    client_module.FLAGS = argparse.Namespace(check_outputs=False)  # main's global; read for beam search only
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _, output_texts = client_module.run_inference(
            triton_client=grpcclient.InferenceServerClient(url=url), prompt=PROMPT, output_len=OUTPUT_LEN,
            request_id="", repetition_penalty=None, presence_penalty=None, frequency_penalty=None,
            temperature=0.0, stop_words=[], bad_words=[], embedding_bias_words=None, embedding_bias_weights=None,
            model_name="minions", streaming=streaming, beam_width=1, overwrite_output_text=False,
            return_log_probs_data=None, return_context_logits_data=None, return_generation_logits_data=None,
            return_perf_metrics_data=np.array([[True]], dtype=bool) if perf else None, end_id=None, pad_id=None,
            batch_inputs=False, verbose=True, num_return_sequences=None, exclude_input_in_output=False,
            lora_dir=None, lora_task_id=None, guided_decoding_guide_type=None, guided_decoding_guide=None)
    return output_texts, printed.getvalue()


@pytest.mark.parametrize("streaming", [False, True])
def test_the_end_to_end_client_with_perf_metrics_gets_greedy_text_from_minions(server, greedy_text, streaming):
    """Its own --check-outputs rule: a non-streamed text starts with the prompt, streamed deltas do not.
    It reads every perf output of every response as [batch][0] and prints it."""
    output_texts, printed = end_to_end(server.grpc_url, streaming, perf=True)
    assert "Received an error from server" not in printed, printed
    assert output_texts == [greedy_text if streaming else PROMPT + greedy_text]
    for name in PERF_OUTPUTS:
        assert re.search(rf"^{name}: \S+$", printed, re.MULTILINE), f"{name} not printed:\n{printed}"
    total = [int(v) for v in re.findall(r"^kv_cache_alloc_total_blocks: (\d+)$", printed, re.MULTILINE)]
    assert total and all(t >= 1 for t in total)
    if streaming:
        assert len(total) > 1, "a response each, each with its perf outputs"


# -- inflight_batcher_llm_client.py against `llm` ------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer_dir(server) -> Path:
    """The deployment's LLM tokenizer, on disk (the client loads it with AutoTokenizer)."""
    return tokenizer_dir_for(server.deployment.llm["source"], server.deployment)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), legacy=False, padding_side="left",
                                         trust_remote_code=True, local_files_only=True)


@pytest.fixture(scope="module")
def greedy_ids(server, tokenizer, greedy_text) -> list[int]:
    """The LLM's 16 greedy tokens after the client's prompt ids (one non-streamed call with the input
    excluded), which are the text `minions` decodes with speculation off."""
    ids = tokenizer.encode(PROMPT)
    arrays = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[OUTPUT_LEN]], np.int32), "runtime_top_k": np.array([[1]], np.int32),
              "end_id": np.array([[tokenizer.eos_token_id]], np.int32),
              "exclude_input_in_output": np.array([[True]], bool)}
    results, errors = [], []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: (errors if error else results).append(error or result))
    try:
        inputs = []
        for name, array in arrays.items():
            tensor = grpcclient.InferInput(name, list(array.shape), grpcclient.np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        client.async_stream_infer("llm", inputs)
    finally:
        client.stop_stream()
        client.close()
    assert not errors and len(results) == 1, errors
    n = int(results[0].as_numpy("sequence_length")[0][0])
    tokens = results[0].as_numpy("output_ids")[0][0][:n].tolist()
    assert len(tokens) == OUTPUT_LEN and tokenizer.decode(tokens, skip_special_tokens=True) == greedy_text
    return tokens


def inflight_batcher(server, tokenizer_dir: Path, tmp_path: Path, *flags: str,
                     expected_ids: list[int] | None = None) -> subprocess.CompletedProcess:
    """inflight_batcher_llm_client.py run as a user runs it, against `llm`, nothing downloaded;
    `expected_ids`: its own check (--check-output), against the ids it should print."""
    command = [sys.executable, str(VENDOR / "inflight_batcher_llm_client.py"), "-u", server.grpc_url,
               "--model-name", "llm", "--tokenizer-dir", str(tokenizer_dir), "--text", PROMPT,
               "--request-output-len", str(OUTPUT_LEN), *flags]
    if expected_ids is not None:
        csv = tmp_path / "expected_output_ids.csv"
        csv.write_text(",".join(map(str, expected_ids)) + "\n")
        command += ["--check-output", "--output-tokens-csv", str(csv)]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("flags", [("--streaming",), ("--streaming", "--exclude-input-in-output"),
                                   ("--num-return-sequences", "1")],
                         ids=["streaming", "streaming-exclude-input", "one-response-over-the-stream"])
def test_the_inflight_batcher_client_gets_greedy_ids_from_llm(server, tokenizer_dir, tokenizer, greedy_ids,
                                                             tmp_path, flags):
    """Its own --check-output passes: the output ids it assembles (the prompt's first unless
    --exclude-input-in-output; streamed responses hold only their new tokens) are the greedy ones.
    `-n 1` without --streaming takes the streaming RPC for one whole response."""
    exclude = "--exclude-input-in-output" in flags
    expected = ([] if exclude else tokenizer.encode(PROMPT)) + greedy_ids
    run = inflight_batcher(server, tokenizer_dir, tmp_path, *flags, expected_ids=expected)
    assert run.returncode == 0 and "PASS!" in run.stdout, run.stdout + run.stderr
    assert f"Output beam 0: {tokenizer.decode(greedy_ids)}\n" in run.stdout
    if "--streaming" in flags:  # its callback prints each response's tokens: one new token each
        lines = (line.replace("np.int32(", "").replace(")", "") for line in run.stdout.splitlines())
        printed = [line for line in lines if re.fullmatch(r"\[[\d, ]*\]", line)]
        assert printed == [f"[{t}]" for t in greedy_ids], run.stdout


def test_the_inflight_batcher_client_without_the_stream_is_told_the_model_is_decoupled(server, tokenizer_dir,
                                                                                       tmp_path):
    """Without --streaming (or -n) it calls ModelInfer, which Triton refuses for a decoupled model, as
    for tensorrt_llm deployed with decoupled_mode true (docs/api.md)."""
    run = inflight_batcher(server, tokenizer_dir, tmp_path)
    assert run.returncode != 0
    assert "doesn't support models with decoupled transaction policy" in run.stdout + run.stderr
