"""Lossless greedy: every speculation mode emits exactly what plain decoding (`off`) emits.

Real SmolLM2 verifiers (llama.cpp on the shipped Q4_1 GGUF, batch-invariant, in the default deployment;
torch fp32 in deploy.torch.yaml), real prompts (harness/prompts.json, MT-bench questions that
ship in datasets/): every mode must match `off` exactly. (Before the default deployment's `batch_invariant`,
llama.cpp computed a k-token verification with other kernels than a 1-token step, and outputs could
leave `off` at near ties of the LLM's logits.)
"""

from __future__ import annotations

import pytest

from client.api import GenerationParams, generate_grpc
from tests.integration.helpers import kept_prompts

PROMPTS = kept_prompts("greedy_equality")
DEFAULT = "default"
MODES = {
    "server": ["single:ssm_suffix", "single:ssm_ngram", "vote", "bandit"],
    "torch_server": ["single:ssm_q4", "single:ssm_ngram", "vote", "bandit", DEFAULT],
}
"""Per deployment (its fixture): the modes compared with `off` (each with a fixed draft length but
DEFAULT, the request that names neither: the torch deployment's vote with its adaptive length, which
asks prompt lookup ahead of ssm_q4)."""
TORCH_PROMPTS = 5
"""The torch deployment runs the first 5 prompts (draft lengths 4..8 each once): a torch step of the
135M model costs about 50 ms on 2 cores, so its 10 prompts took 150 s of `make test`'s 20 minutes."""
CASES = [(deployment, index) for deployment in MODES
         for index in range(TORCH_PROMPTS if deployment == "torch_server" else len(PROMPTS))]


@pytest.mark.parametrize("deployment, index", CASES)
def test_speculative_modes_equal_plain_greedy(request, deployment, index):
    server = request.getfixturevalue(deployment)
    prompt = PROMPTS[index]

    def run(mode: str, k: int = 4):
        params = (GenerationParams(max_tokens=48, chat=True) if mode == DEFAULT else
                  GenerationParams(max_tokens=48, chat=True, speculation=mode, num_draft_tokens=k))
        return generate_grpc(server.grpc_url, "minions", prompt, params)

    plain = run("off")
    assert plain.num_output_tokens > 0
    for mode in MODES[deployment]:
        spec = run(mode, k=4 + index % 5)  # vary k across prompts: 4..8
        assert (spec.text, spec.num_output_tokens) == (plain.text, plain.num_output_tokens), (
            f"{mode} diverged from off on prompt {index}:\noff:  {plain.text!r}\n{mode}: {spec.text!r}"
        )
        if mode == "single:ssm_q4":  # the n-gram drafter legitimately finds nothing on some prompts
            assert spec.total_draft_tokens > 0
