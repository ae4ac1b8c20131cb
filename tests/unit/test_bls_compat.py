"""minions.serving.compat: tensorrt_llm_bls inputs Minions does not honour are accepted at their neutral
values, as tensorrtllm_backend's clients send them by default, and refused otherwise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minions.decoding.penalties import Penalties
from minions.errors import InvalidRequest
from minions.serving.compat import NEUTRAL_ONLY, UNSUPPORTED_FEATURES
from minions.serving.request import parse_generation_request
from minions.settings import OrchestratorSettings

LIMITS = OrchestratorSettings(ssm_model_names=("ngram",))


def one(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def parse(**inputs):
    return parse_generation_request({"text_input": one(b"hi", object), **inputs}, LIMITS)


def test_what_an_end_to_end_client_sends_by_default_is_accepted():
    """tensorrtllm_backend's end_to_end_grpc_client: beam_width 1, one sequence, penalties at their
    neutral values, no log probs or logits, empty embedding bias lists, length_penalty whatever."""
    req = parse(beam_width=one(1, np.int32), num_return_sequences=one(1, np.int32), min_tokens=one(1, np.int32),
                repetition_penalty=one(1.0, np.float32), presence_penalty=one(0.0, np.float32),
                frequency_penalty=one(0.0, np.float32), length_penalty=one(1.3, np.float32),
                return_log_probs=one(False, bool), return_context_logits=one(False, bool),
                return_generation_logits=one(False, bool), embedding_bias_words=np.zeros((1, 0), dtype=object),
                embedding_bias_weights=np.zeros((1, 0), dtype=np.float32), pad_id=one(2, np.int32))
    # Accepted, and changing nothing but min_tokens (honoured as sent): the same request as without
    # them, with no penalty, log probs or logits asked for.
    assert req == dataclasses.replace(parse(), penalties=Penalties(min_tokens=1))
    assert req.text == "hi" and not req.return_log_probs
    assert (req.penalties.repetition, req.penalties.presence, req.penalties.frequency) == (1.0, 0.0, 0.0)


@pytest.mark.parametrize("name, value, dtype, message", [
    ("beam_width", 4, np.int32, "input 'beam_width' is 4: beam search is not supported: send beam_width 1"),
    ("num_return_sequences", 2, np.int32, "send num_return_sequences 1"),
    ("return_context_logits", True, bool, "context logits are not returned"),
    ("return_generation_logits", True, bool, "generation logits are not returned"),
])
def test_a_value_minions_cannot_honour_is_refused(name, value, dtype, message):
    with pytest.raises(InvalidRequest, match=message):
        parse(**{name: one(value, dtype)})


@pytest.mark.parametrize("name, array, feature", [
    ("lora_task_id", one(3, np.uint64), "LoRA adapters are not supported"),
    ("lora_weights", np.zeros((1, 2, 4), dtype=np.float16), "LoRA adapters"),
    ("prompt_embedding_table", np.zeros((1, 2, 4), dtype=np.float16), "prompt tuning"),
    ("embedding_bias_words", np.array([[b"cat"]], dtype=object), "embedding bias"),
    ("guided_decoding_guide_type", one(b"json", object), "guided decoding"),
    ("image_url_input", one(b"http://x/y.png", object), "image input"),
    ("decoder_text_input", one(b"hello", object), "encoder-decoder models"),
])
def test_an_unsupported_feature_is_refused_when_given(name, array, feature):
    with pytest.raises(InvalidRequest, match=rf"input '{name}': {feature}"):
        parse(**{name: array})


def test_every_refusal_names_a_declared_input():
    """Each input the checks know is declared by the minions model (so a client can send it at all)."""
    from minions.serving.inputs import pbtxt_inputs

    config = pbtxt_inputs()  # what the renderer writes into the model's config.pbtxt
    for name in [*UNSUPPORTED_FEATURES, *NEUTRAL_ONLY, "length_penalty"]:
        assert f'name: "{name}"' in config, name


def test_log_probs_are_returned_when_asked():
    assert parse(return_log_probs=one(True, bool)).return_log_probs and not parse().return_log_probs


def test_penalties_and_min_tokens_are_applied_not_refused():
    req = parse(repetition_penalty=one(1.2, np.float32), presence_penalty=one(0.5, np.float32),
                frequency_penalty=one(-0.5, np.float32), min_tokens=one(8, np.int32))
    p = req.penalties
    assert (p.repetition, p.presence, p.frequency, p.min_tokens) == pytest.approx((1.2, 0.5, -0.5, 8))


@pytest.mark.parametrize("name, value, dtype, message", [
    ("repetition_penalty", 0.0, np.float32, "'repetition_penalty' must be > 0"),
    ("presence_penalty", np.inf, np.float32, "'presence_penalty' must be a finite number"),
    ("min_tokens", -1, np.int32, "'min_tokens' must be >= 0"),
])
def test_out_of_range_penalties_are_refused(name, value, dtype, message):
    with pytest.raises(InvalidRequest, match=message):
        parse(**{name: one(value, dtype)})
