"""minions.serving.request: client inputs (numpy arrays as Triton hands them) to a GenerationRequest."""

from __future__ import annotations


import numpy as np
import pytest

from minions.decoding.sampling import SamplingParams
from minions.errors import InvalidRequest
from minions.serving.request import parse_generation_request
from minions.settings import OrchestratorSettings
from minions.speculation.mode import Speculation, SpeculationMode

LIMITS = OrchestratorSettings().with_keys(
    max_tokens_limit=256,
    default_max_tokens=32,
    default_num_draft_tokens="4",
    max_num_draft_tokens=8,
    ssm_model_names=("ssm_q4", "ngram"),
)


def text(value) -> np.ndarray:
    return np.array([[value]], dtype=object)


def i32(value) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


def f32(value) -> np.ndarray:
    return np.array([[value]], dtype=np.float32)


def parse(**inputs):
    inputs.setdefault("text_input", text(b"hi"))
    return parse_generation_request(inputs, LIMITS)


def test_minimal_request_gets_defaults_from_limits():
    req = parse()
    assert req.text == "hi"
    assert req.max_tokens == LIMITS.default_max_tokens
    assert req.num_draft_tokens == LIMITS.num_draft_tokens
    assert req.sampling == SamplingParams(temperature=0.0, top_k=0, top_p=1.0) and req.sampling.greedy
    assert req.speculation == Speculation.parse(LIMITS.default_speculation, LIMITS.ssm_model_names)
    assert req.speculation == Speculation(SpeculationMode.VOTE, LIMITS.ssm_model_names), "the shipped default"
    assert (req.pipeline, req.use_draft_logits) == (LIMITS.pipeline, LIMITS.default_use_draft_logits) == (True, True)
    assert req.seed is None and req.end_id is None
    assert req.stop_words == () and req.bad_words == ()
    assert not req.stream and not req.exclude_input_in_output and not req.return_perf_metrics
    assert req.chat is LIMITS.default_chat


def test_full_request():
    req = parse(
        text_input=text("héllo".encode()),
        max_tokens=i32(64),
        stream=np.array([[True]]),
        temperature=f32(0.5),
        top_p=f32(0.75),
        top_k=i32(40),
        seed=np.array([[2**63 + 5]], dtype=np.uint64),
        stop_words=np.array([[b"\n\n", b"", b"END"]], dtype=object),
        bad_words=np.array([[b"darn"]], dtype=object),
        end_id=i32(2),
        pad_id=i32(0),
        exclude_input_in_output=np.array([[True]]),
        num_draft_tokens=i32(6),
        speculation=text(b"single:ssm_q4"),
        return_perf_metrics=np.array([[True]]),
        chat=np.array([[True]]),
    )
    assert req.text == "héllo" and req.max_tokens == 64 and req.stream
    assert req.sampling == SamplingParams(temperature=0.5, top_k=40, top_p=0.75)
    assert req.seed == 2**63 + 5, "uint64 seeds must survive without overflow"
    assert req.stop_words == ("\n\n", "END"), "empty strings are dropped"
    assert req.bad_words == ("darn",)
    assert req.end_id == 2
    assert req.exclude_input_in_output and req.return_perf_metrics and req.chat
    assert req.num_draft_tokens == 6
    assert req.speculation == Speculation("single", ("ssm_q4",))
    assert str(req.speculation) == "single:ssm_q4"


def test_random_seed_is_an_alias_for_seed():
    assert parse(random_seed=np.array([[9]], dtype=np.uint64)).seed == 9
    assert parse(seed=np.array([[1]], dtype=np.uint64), random_seed=np.array([[9]], dtype=np.uint64)).seed == 1


def test_str_text_input_and_flat_shapes_are_accepted():
    assert parse(text_input=np.array(["hello"], dtype=object)).text == "hello"
    assert parse(max_tokens=np.array([7], dtype=np.int32)).max_tokens == 7


def test_num_draft_tokens_zero_turns_speculation_off():
    req = parse(num_draft_tokens=i32(0), speculation=text(b"single:ngram"))
    assert req.speculation == Speculation(SpeculationMode.OFF)
    assert req.num_draft_tokens == 0


def test_default_speculation_comes_from_limits():
    limits = OrchestratorSettings(default_speculation="single:ngram", ssm_model_names=("ngram",))
    req = parse_generation_request({"text_input": text(b"x")}, limits)
    assert req.speculation == Speculation("single", ("ngram",))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"text_input": text(b"")}, "'text_input' is empty"),
        ({"text_input": text(b"  \n ")}, "'text_input' is empty"),
        ({"text_input": text(b"\xff\xfe")}, "'text_input' is not valid UTF-8"),
        ({"text_input": text(b"ok \xe2\x82")}, "'text_input' is not valid UTF-8"),
        ({"text_input": np.array([[b"a", b"b"]], dtype=object)}, "'text_input' must hold one value"),
        ({"max_tokens": i32(0)}, r"'max_tokens' must be in \[1, 256\], got 0"),
        ({"max_tokens": i32(-3)}, r"'max_tokens' must be in \[1, 256\], got -3"),
        ({"max_tokens": i32(257)}, r"'max_tokens' must be in \[1, 256\], got 257"),
        ({"max_tokens": np.array([[16, 16]], dtype=np.int32)}, r"'max_tokens' must hold one value, got shape \[1, 2\]"),
        ({"temperature": f32(-0.1)}, "'temperature' must be >= 0"),
        ({"temperature": f32(np.nan)}, "'temperature' must be >= 0, got nan"),
        ({"temperature": f32(np.inf)}, "'temperature' must be >= 0"),
        ({"top_p": f32(0.0)}, r"'top_p' must be in \(0, 1\], got 0.0"),
        ({"top_p": f32(1.5)}, r"'top_p' must be in \(0, 1\]"),
        ({"top_p": f32(np.nan)}, r"'top_p' must be in \(0, 1\]"),
        ({"top_k": i32(-1)}, "'top_k' must be >= 0, got -1"),
        ({"num_draft_tokens": i32(-1)}, r"'num_draft_tokens' must be in \[0, 8\]"),
        ({"num_draft_tokens": i32(9)}, r"'num_draft_tokens' must be in \[0, 8\], got 9"),
        ({"speculation": text(b"single:nope")}, "unknown SSM 'nope'.*known: ssm_q4, ngram"),
        (
            {"speculation": text(b"tree:ssm_q4")},
            "unknown speculation 'tree:ssm_q4'; use one of: off, vote, bandit, single:ssm_q4, single:ngram",
        ),
        ({"speculation": text(b"vote:ssm_q4,nope")}, "unknown SSM 'nope' in speculation 'vote:ssm_q4,nope'"),
        ({"speculation": text(b"single:ssm_q4,ngram")}, "unknown speculation 'single:ssm_q4,ngram'"),
        ({"speculation": text(b"\xc3")}, "'speculation' is not valid UTF-8"),
        ({"stop_words": np.array([[b"ok", b"\xff"]], dtype=object)}, "'stop_words' is not valid UTF-8"),
        # A lone surrogate as Triton's HTTP frontend passes JSON's "\udc00" on (its three UTF-8-like bytes),
        # in every BYTES input the model reads, and as a str (the tokenizer's TypeError otherwise)
        ({"text_input": text("ab\udc00".encode("utf-8", "surrogatepass"))},
         "input 'text_input': a lone UTF-16 surrogate at character 2 is not Unicode text"),
        ({"text_input": text("\ud800")}, "input 'text_input': a lone UTF-16 surrogate at character 0"),
        ({"stop_words": np.array([[b"ok", "\udfff".encode("utf-8", "surrogatepass")]], dtype=object)},
         "input 'stop_words': a lone UTF-16 surrogate"),
        ({"bad_words": np.array([["\ud83d".encode("utf-8", "surrogatepass")]], dtype=object)},
         "input 'bad_words': a lone UTF-16 surrogate"),
        ({"speculation": text("off\udc00".encode("utf-8", "surrogatepass"))},
         "input 'speculation': a lone UTF-16 surrogate at character 3"),
        ({"bad_words": np.array([[b"\xc3"]], dtype=object)}, "'bad_words' is not valid UTF-8"),
        ({"top_p": f32(np.inf)}, r"'top_p' must be in \(0, 1\], got inf"),
        ({"repetition_penalty": f32(np.nan)}, "'repetition_penalty' must be > 0"),
        ({"presence_penalty": f32(-np.inf)}, "'presence_penalty' must be a finite number"),
        ({"min_tokens": i32(-1)}, "'min_tokens' must be >= 0, got -1"),
        ({"max_tokens": i32(2**31 - 1)}, r"'max_tokens' must be in \[1, 256\], got 2147483647"),
        ({"speculation": text(b"")}, "unknown speculation ''"),
        ({"beam_width": i32(2)}, "beam search is not supported"),
        ({"image_url_input": text(b"http://x")}, "image input are not supported"),
    ],
)
def test_bad_input_gives_helpful_invalid_request(inputs, message):
    with pytest.raises(InvalidRequest, match=message):
        parse(**inputs)


def test_missing_text_input():
    with pytest.raises(InvalidRequest, match="input 'text_input' is required"):
        parse_generation_request({"max_tokens": i32(4)}, LIMITS)


def test_invalid_request_is_a_value_error():
    """Callers that only know ValueError still catch client errors."""
    assert issubclass(InvalidRequest, ValueError)


def test_boundaries_are_inclusive():
    assert parse(max_tokens=i32(1)).max_tokens == 1
    assert parse(max_tokens=i32(256)).max_tokens == 256
    assert parse(top_p=f32(1.0)).sampling.top_p == 1.0
    assert parse(num_draft_tokens=i32(8)).num_draft_tokens == 8
    assert parse(temperature=f32(0.0)).sampling.greedy


@pytest.mark.parametrize("text_value", [" off ", "off"])
def test_speculation_parse_strips_whitespace(text_value):
    assert Speculation.parse(text_value, ()) == Speculation(SpeculationMode.OFF)


def test_speculation_parse_single():
    assert Speculation.parse("single:a", ("a", "b")) == Speculation("single", ("a",))
    with pytest.raises(InvalidRequest, match="unknown SSM ''"):
        Speculation.parse("single:", ("a",))


def test_vote_and_bandit_use_every_ssm_unless_listed():
    known = ("a", "b", "c")
    assert Speculation.parse("vote", known) == Speculation("vote", known)
    assert Speculation.parse("bandit", known) == Speculation("bandit", known)
    assert Speculation.parse("vote:c, a", known) == Speculation("vote", ("c", "a"))
    assert Speculation.parse("vote:a,a", known) == Speculation("vote", ("a",))
    assert Speculation.parse("vote:a,b", known).label == "vote"
    assert Speculation.parse("single:b", known).label == "single:b"


def test_vote_needs_at_least_one_ssm():
    with pytest.raises(InvalidRequest, match="unknown speculation 'vote'"):
        Speculation.parse("vote", ())


def _stops(*words: bytes) -> np.ndarray:
    return np.array([list(words)], dtype=object)


def test_stop_strings_are_bounded_in_number_and_length():
    """Each stop string is matched at every token, at a cost growing with the square of its length."""
    limits = LIMITS.with_keys(max_stop_strings=2, max_stop_chars=3)
    at_limits = _stops(b"abc", b"", "é".encode() * 3)
    request = parse_generation_request({"text_input": text(b"hi"), "stop_words": at_limits}, limits)
    assert request.stop_words == ("abc", "ééé"), "at the limits (empty strings dropped, characters counted)"
    with pytest.raises(InvalidRequest, match=r"'stop_words' may hold at most 2 stop strings \(max_stop_strings\), "
                                              "got 3"):
        parse_generation_request({"text_input": text(b"hi"), "stop_words": _stops(b"a", b"b", b"c")}, limits)
    with pytest.raises(InvalidRequest, match=r"at most 3 characters \(max_stop_chars\), got one of 4"):
        parse_generation_request({"text_input": text(b"hi"), "stop_words": _stops(b"abcd")}, limits)


def test_the_default_stop_limits_refuse_a_huge_list_and_a_huge_string():
    with pytest.raises(InvalidRequest, match=f"at most {LIMITS.limits.stop_strings} stop strings"):
        parse(stop_words=_stops(*[b"x%d" % i for i in range(10_000)]))
    with pytest.raises(InvalidRequest, match=f"at most {LIMITS.limits.stop_chars} characters"):
        parse(stop_words=_stops(b"x" * 100_000))


def test_bad_words_are_not_bound_by_the_stop_limits():
    limits = LIMITS.with_keys(max_stop_strings=1, max_stop_chars=1)
    request = parse_generation_request({"text_input": text(b"hi"), "bad_words": _stops(b"darn", b"heck")}, limits)
    assert request.bad_words == ("darn", "heck")
