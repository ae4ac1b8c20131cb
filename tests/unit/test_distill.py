"""minions.distill on a tiny random teacher: data, reduced-vocabulary draft model, training, replay, serving."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minions.decoding.engine_call import EngineRequest
from minions.distill.evaluate import replay_acceptance
from minions.distill.teacher_data import teacher_generate
from minions.distill.train import (
    TrainConfig,
    boost_weights,
    greedy_predictions,
    reduced_vocab,
    train_draft,
    validation_loss,
    vocab_coverage,
)
from minions.engines.distilled_model import DistilledDraftModel, is_distilled_dir, load_draft_model
from minions.engines.factory import build_engine
from minions.engines.torch_engine import TorchEngine
from minions.settings import EngineSettings
from tiny_models import VOCAB, full_logits, hf_greedy


@pytest.fixture(scope="module")
def examples(tiny_llm):
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, VOCAB, 5)] for _ in range(24)]
    examples, used = teacher_generate(tiny_llm, prompts, 12, 8, pad_id=0, eos_id=None, deadline_s=60, desc="test")
    assert used == len(prompts)
    return examples


def test_teacher_data_is_the_llms_greedy_output_labelled_by_its_argmax(examples, tiny_llm):
    e = examples[0]
    assert e.tokens[e.prompt_len :] == hf_greedy(tiny_llm, e.tokens[: e.prompt_len], 12)
    assert e.labels == [int(t) for t in full_logits(tiny_llm, e.tokens).argmax(-1)]
    # on the continuation, the label is the next token itself (greedy)
    assert e.labels[e.prompt_len - 1 : -1] == e.tokens[e.prompt_len :]


def test_prompt_only_examples_are_labelled_at_every_position(tiny_llm):
    from minions.distill.teacher_data import label_prompts

    (e,) = label_prompts(tiny_llm, [[3, 7, 1, 9]], 4, pad_id=0)
    assert e.prompt_len == 4 and e.labels == [int(t) for t in full_logits(tiny_llm, [3, 7, 1, 9]).argmax(-1)]


def test_reduced_vocab_keeps_the_most_frequent_labels(examples):
    vocab = reduced_vocab(examples, 6, always=[15])
    assert len(vocab) == 6 and 15 in vocab.tolist() and vocab.tolist() == sorted(vocab.tolist())
    assert 0.0 < vocab_coverage(examples, vocab) <= 1.0
    assert vocab_coverage(examples, torch.arange(VOCAB)) == 1.0


def test_draft_model_scores_only_its_vocabulary_and_matches_the_teacher_layers(tiny_llm):
    vocab = torch.tensor([1, 4, 9])
    full = DistilledDraftModel.from_teacher(tiny_llm, [0, 1], torch.arange(VOCAB))
    ids = torch.tensor([[3, 7, 1, 9]])
    with torch.no_grad():
        # all layers + the whole head: it is the teacher itself
        np.testing.assert_allclose(full(ids).logits[0].numpy(), full_logits(tiny_llm, [3, 7, 1, 9]), rtol=1e-4, atol=1e-4)
        reduced = DistilledDraftModel.from_teacher(tiny_llm, [0], vocab)
        logits = reduced(ids).logits[0]
    outside = [t for t in range(VOCAB) if t not in vocab.tolist()]
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, vocab]).all()


def test_training_lowers_validation_loss_and_raises_acceptance(tiny_llm, examples):
    """Starting from the teacher's second layer alone (a weak draft), 60 steps on 16 examples."""
    vocab = reduced_vocab(examples, VOCAB, always=[])
    model = DistilledDraftModel.from_teacher(tiny_llm, [1], vocab)
    validation = examples[:8]
    loss_before = validation_loss(model, validation, torch.arange(VOCAB))
    before = replay_acceptance(TorchEngine(model), validation, 3)
    # eval_every_s=0: validation after every step, so the kept checkpoint does not depend on timing
    report = train_draft(model, examples[8:], TrainConfig(minutes=5, batch_size=8, lr=3e-3, eval_every_s=0.0, max_steps=60),
                         validation=validation)
    after = replay_acceptance(TorchEngine(model), validation, 3)
    assert report.steps == 60 and report.tokens > 0
    assert report.best_validation_loss == pytest.approx(validation_loss(model, validation, torch.arange(VOCAB)), rel=1e-4)
    assert report.best_validation_loss < 0.5 * loss_before
    assert after.acceptance > before.acceptance
    assert after.drafted > 0 and after.ms_per_draft_token > 0


def test_boost_weights_mark_the_other_models_mistakes(examples, tiny_llm):
    model = DistilledDraftModel.from_teacher(tiny_llm, [0], torch.arange(VOCAB))
    preds = greedy_predictions(model, examples[:3])
    weights = boost_weights(examples[:3], preds, boost=2.0)
    for e, p, w in zip(examples[:3], preds, weights, strict=True):
        assert w == [3.0 if a != b else 1.0 for a, b in zip(p, e.labels, strict=True)]


def test_saved_model_is_served_by_the_distilled_engine(tmp_path, tiny_llm):
    model = DistilledDraftModel.from_teacher(tiny_llm, [0, 1], torch.arange(VOCAB))
    model.save(tmp_path / "d", {"name": "d"})
    assert is_distilled_dir(tmp_path / "d") and not is_distilled_dir(tmp_path)
    engine = build_engine(EngineSettings(engine="distilled", model_path=str(tmp_path / "d"), num_threads=1))
    out = engine.generate(EngineRequest("r", [3, 7, 1], 5, exclude_input_in_output=True))
    assert out.tokens == hf_greedy(tiny_llm, [3, 7, 1], 5), "all layers and the full head: the teacher's own greedy"
    loaded = load_draft_model(tmp_path / "d")
    assert torch.equal(loaded.vocab, model.vocab)
    with pytest.raises(FileNotFoundError, match="make distill"):
        load_draft_model(tmp_path)
