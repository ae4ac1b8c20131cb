"""minions.serving.flow: a request's way from parsed inputs to the decode loop's request, KV
admission, and from rounds of tokens to the client's text (end_id, stop strings, finish_reason, chunks).

The tokenizer here maps one token to one character (ids are indices into ALPHABET), so every
expected text is written out by hand; the real SmolLM2 tokenizer is exercised by
test_detokenizer.py and the integration tests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np
import pytest

from minions.errors import InvalidRequest
from minions.serving.admission import Admission
from minions.serving.flow import RequestPerf, TextStream, admit, decode_request, response_arrays
from minions.serving.request import GenerationRequest, parse_generation_request
from minions.settings import DEFAULTS, OrchestratorSettings
from minions.speculation.mode import Speculation, SpeculationMode
from minions.speculation.rounds import Round
from minions.text.prompt import chat_messages
from tests.support.model_config import BLS_TEXT_OUTPUT, shape_breaches, template_config

ALPHABET = "abcdefghijklmnopqrstuvwxyz .!$"
EOS = ALPHABET.index("$")


class CharTokenizer:
    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ALPHABET.index(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(ALPHABET[i] for i in ids if not (skip_special_tokens and i == EOS))

    def apply_chat_template(self, messages: list[dict], **kwargs) -> str:
        return "".join(m["content"] for m in messages) + "!"

    def __len__(self) -> int:
        return len(ALPHABET)


def ids(text: str) -> list[int]:
    return CharTokenizer().encode(text)


def greq(**kwargs) -> GenerationRequest:
    """A request as the parser makes it from "say hi" with the default settings (serving no SSM, so
    plain decoding), then `kwargs`."""
    kwargs.setdefault("text", "say hi")
    kwargs.setdefault("max_tokens", 32)
    limits = replace(DEFAULTS, default_speculation="off")
    parsed = parse_generation_request({"text_input": np.array([[b"say hi"]], dtype=object)}, limits)
    return replace(parsed, **kwargs)


def rnd(text: str, last: bool = False, tokens: list[int] | None = None) -> Round:
    tokens = ids(text) if tokens is None else tokens
    return Round(tokens=tokens, ssm=None, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.0, last=last)


def run(stream: TextStream, rounds: list[Round]) -> tuple[list[str], str]:
    """What the adapter does: add rounds until done, sending a chunk after each one that is not the end."""
    chunks = []
    for r in rounds:
        if stream.add(r):
            break
        if chunk := stream.chunk():
            chunks.append(chunk)
    return chunks, stream.final()


def test_a_non_streamed_request_gets_the_prompt_and_all_the_text_at_the_end():
    stream = TextStream(greq(), CharTokenizer(), EOS)
    chunks, final = run(stream, [rnd("hel"), rnd("lo"), rnd(" you", last=True)])
    assert chunks == [] and final == "say hihello you"
    assert stream.finish_reason == "length" and stream.stats.emitted_tokens == 9


def test_exclude_input_in_output_leaves_the_prompt_out():
    stream = TextStream(greq(exclude_input_in_output=True), CharTokenizer(), EOS)
    assert run(stream, [rnd("ok", last=True)])[1] == "ok"


def test_a_streamed_request_gets_each_round_as_a_chunk_and_no_prompt():
    stream = TextStream(greq(stream=True), CharTokenizer(), EOS)
    chunks, final = run(stream, [rnd("hel"), rnd("lo"), rnd(" you", last=True)])
    assert chunks == ["hel", "lo"] and final == " you"


def test_end_id_ends_the_text_within_its_round():
    stream = TextStream(greq(stream=True), CharTokenizer(), EOS)
    chunks, final = run(stream, [rnd("ab"), rnd("", tokens=ids("cd") + [EOS] + ids("zz"), last=True)])
    assert "".join(chunks) + final == "abcd" and stream.finish_reason == "stop"


def test_a_stop_string_split_across_rounds_is_never_sent_and_ends_the_request():
    stream = TextStream(greq(stream=True, stop_words=("end.",)), CharTokenizer(), EOS)
    rounds = [rnd("the e"), rnd("nd. more"), rnd("never reached", last=True)]
    chunks, final = run(stream, rounds)
    assert "".join(chunks) + final == "the " and stream.finish_reason == "stop"
    assert stream.stats.rounds == 2, "the round after the stop string is not consumed"


def test_a_partial_stop_string_at_the_end_is_sent_after_all():
    stream = TextStream(greq(stop_words=("end.",)), CharTokenizer(), EOS)
    assert run(stream, [rnd("the en", last=True)])[1] == "say hithe en"
    assert stream.finish_reason == "length"


def test_decode_request_bounds_max_tokens_by_the_context_and_defaults_end_id_to_eos():
    settings = DEFAULTS.with_keys(max_context=10, max_num_draft_tokens=6)
    request = decode_request(greq(text="abcd", bad_words=("xy",), speculation=Speculation(SpeculationMode.OFF)),
                             CharTokenizer(), settings)
    assert request.prompt_ids == ids("abcd") and request.max_new_tokens == 6
    assert request.end_id == EOS and request.max_draft_tokens == 6
    assert request.bad_words.words == [ids("xy")]
    assert decode_request(greq(text="ab", end_id=3), CharTokenizer(), settings).end_id == 3
    assert decode_request(greq(text="ab", chat=True), CharTokenizer(), settings).prompt_ids == ids("ab!")


def test_decode_request_refuses_a_prompt_that_leaves_no_room():
    with pytest.raises(InvalidRequest, match="prompt is 10 tokens; the context holds 10"):
        decode_request(greq(text="abcdefghij"), CharTokenizer(), DEFAULTS.with_keys(max_context=10))


@pytest.mark.parametrize("end_id", [-1, len(ALPHABET), 999999])
def test_decode_request_refuses_an_end_id_outside_the_vocabulary(end_id):
    with pytest.raises(InvalidRequest, match=rf"'end_id' must be a token id in \[0, {len(ALPHABET) - 1}\], got {end_id}"):
        decode_request(greq(end_id=end_id), CharTokenizer(), OrchestratorSettings())


@pytest.mark.parametrize("text, message", [
    ("[]", "empty list of messages"),
    ('[{"role": "user", "content": null}]', "chat message 0 has content of type NoneType"),
    ('[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]', "content of type list"),
    ('[{"role": "user", "content": "hi"}, {"content": "hi"}]', "chat message 1 has role None"),
    ('[{"role": "wizard", "content": "hi"}]', "role 'wizard': use one of system, user"),
])
def test_malformed_chat_messages_are_refused_with_what_to_change(text, message):
    with pytest.raises(InvalidRequest, match=message):
        decode_request(greq(text=text, chat=True), CharTokenizer(), OrchestratorSettings())


@pytest.mark.parametrize("text", ["[a] is a list", "[1, 2]", "[ not json", "[" * 100_000 + "]" * 100_000])
def test_chat_text_that_only_opens_with_a_bracket_is_the_users_message(text):
    """Text nested deeper than json parses (its RecursionError was an internal error) is text too."""
    assert chat_messages(text) == [{"role": "user", "content": text}]


class RustTokenizer(CharTokenizer):
    """Refuses what Hugging Face's tokenizers refuse: text UTF-8 cannot encode."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        text.encode("utf-8")  # raises UnicodeEncodeError, as tokenizers raise TypeError
        return super().encode(text, add_special_tokens)


@pytest.mark.parametrize("text, message", [
    ('[{"role": "user", "content": "ab\\ud800"}]', "chat message 0, 'content': a lone UTF-16 surrogate at character 2"),
    ('[{"role": "system", "content": "a"}, {"role": "user", "content": "\\udfff"}]',
     "chat message 1, 'content': a lone UTF-16 surrogate at character 0 is not Unicode text"),
    ('[{"role": "user", "content": "a", "name": "\\udc00"}]', "chat message 0, 'name': a lone UTF-16 surrogate"),
    ('[{"role": "user", "content": "a", "\\ud800": 1}]', "chat message 0: a lone UTF-16 surrogate"),
])
def test_a_lone_surrogate_in_chat_messages_is_refused_before_the_tokenizer(text, message):
    """JSON's escape spells a surrogate that UTF-8 cannot: the tokenizer's TypeError was a 500."""
    with pytest.raises(InvalidRequest, match=message):
        decode_request(greq(text=text, chat=True), RustTokenizer(), OrchestratorSettings())


def test_a_surrogate_pair_in_chat_messages_is_text():
    assert chat_messages('[{"role": "user", "content": "\\ud83d\\ude00"}]')[0]["content"] == "\U0001f600"


def test_a_chat_template_error_is_an_invalid_request():
    class StrictTemplate(CharTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant")

    with pytest.raises(InvalidRequest, match="chat template rejected the messages: Conversation roles must alternate"):
        decode_request(greq(text="hi", chat=True), StrictTemplate(), OrchestratorSettings())


def test_admission_reserves_the_worst_case_and_waits_in_order():
    async def scenario():
        admission = Admission(max_sequences=8, capacity_tokens=40)
        settings = DEFAULTS.with_keys(max_num_draft_tokens=4)
        first = decode_request(greq(text="abcde", max_tokens=20), CharTokenizer(), settings)
        held = await admit(admission, first, "a")
        assert held.tokens == 5 + 20 + 4 + 1 == admission.in_use
        waiting = asyncio.ensure_future(admit(admission, first, "b"))
        await asyncio.sleep(0)
        assert not waiting.done() and admission.waiting == 1
        held.release()
        second = await waiting
        assert second.tokens == 30 and admission.in_use == 30

    asyncio.run(scenario())


def test_response_arrays_carry_perf_metrics_only_when_asked():
    perf = RequestPerf(arrival_ns=time.time_ns(), prompt_tokens=200, block_tokens=128)
    perf.scheduled_ns = time.time_ns()
    stream = TextStream(greq(), CharTokenizer(), EOS, perf)
    stream.add(Round(tokens=ids("ab"), ssm="s", drafted=3, accepted=1, draft_seconds=0.0, verify_seconds=0.0,
                     planned=3))
    plain = response_arrays(greq(), "ab", stream, None)
    assert set(plain) == {"text_output", "num_output_tokens", "num_input_tokens", "num_cached_tokens", "batch_index",
                          "sequence_index"}
    assert plain["text_output"].tolist() == [b"ab"]
    assert plain["batch_index"].tolist() == plain["sequence_index"].tolist() == [[0]]
    assert plain["num_input_tokens"].tolist() == [[200]] and plain["num_cached_tokens"].tolist() == [[0]]
    full = response_arrays(greq(return_perf_metrics=True), "ab", stream, "stop")
    assert full["finish_reason"].tolist() == [[b"stop"]]
    assert full["total_draft_tokens"].tolist() == [[3]] and full["total_accepted_draft_tokens"].tolist() == [[1]]
    np.testing.assert_allclose(full["acceptance_rate"], [[1 / 3]], rtol=1e-6)
    assert full["draft_lengths"].tolist() == [[3]]
    assert (full["arrival_time_ns"][0, 0] <= full["first_scheduled_time_ns"][0, 0] <= full["first_token_time_ns"][0, 0]
            <= full["last_token_time_ns"][0, 0])
    assert full["kv_cache_alloc_total_blocks"].tolist() == full["kv_cache_alloc_new_blocks"].tolist() == [[2]]  # 202
    assert full["kv_cache_reused_blocks"].tolist() == [[0]]


def test_the_prompt_tokens_the_llm_found_cached_are_reported_as_reused_blocks_and_tokens():
    perf = RequestPerf(arrival_ns=time.time_ns(), prompt_tokens=300, block_tokens=128)
    stream = TextStream(greq(), CharTokenizer(), EOS, perf)
    stream.add(Round(tokens=ids("a"), ssm=None, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.0,
                     cached_tokens=299))
    stream.add(Round(tokens=ids("b"), ssm=None, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.0))
    out = response_arrays(greq(return_perf_metrics=True), "ab", stream, None)
    assert out["kv_cache_alloc_total_blocks"].tolist() == [[3]]  # 302 tokens
    assert out["kv_cache_reused_blocks"].tolist() == [[2]], "whole blocks of the 299 cached tokens"
    assert out["kv_cache_alloc_new_blocks"].tolist() == [[1]]
    assert response_arrays(greq(), "ab", stream, None)["num_cached_tokens"].tolist() == [[299]], \
        "asked for perf metrics or not"


@pytest.mark.parametrize("streamed", [False, True])
def test_response_arrays_have_the_shapes_the_minions_config_declares(streamed):
    """Every output is [batch = 1, its config dims], as tensorrt_llm_bls sends them (the end-to-end
    client reads each perf output as [0][0]); text_output alone is [1], as tensorrt_llm_bls sends it."""
    config = template_config("minions")
    stream = TextStream(greq(stream=streamed, return_log_probs=True), CharTokenizer(), EOS,
                        RequestPerf(arrival_ns=time.time_ns(), prompt_tokens=20))
    stream.add(Round(tokens=ids("ab"), ssm="s", drafted=3, accepted=1, draft_seconds=0.0, verify_seconds=0.0,
                     planned=3, log_probs=[-0.5, -0.25]))
    for finish_reason in (None, "stop"):
        arrays = response_arrays(greq(stream=streamed, return_perf_metrics=True, return_log_probs=True), "ab",
                                 stream, finish_reason)
        assert {"finish_reason", "draft_lengths", "cum_log_probs"} - set(arrays) == (
            {"finish_reason"} if finish_reason is None else set())
        assert shape_breaches(config, {n: a.shape for n, a in arrays.items()}, BLS_TEXT_OUTPUT) == {}


def test_request_latencies_from_arrival_first_and_last_tokens():
    perf = RequestPerf(arrival_ns=1_000_000_000)
    assert perf.latencies(0)[:2] == (None, None)
    perf.first_token_ns, perf.last_token_ns = 1_250_000_000, 2_250_000_000
    ttft, itl, e2e = perf.latencies(11)
    assert (ttft, itl, e2e) == (0.25, 0.1, 1.25)
    assert perf.latencies(1)[1] is None, "one token: no time per output token"


def test_log_probs_go_out_with_the_response_that_follows_their_tokens():
    stream = TextStream(greq(return_log_probs=True, stream=True), CharTokenizer(), EOS)
    stream.add(Round(tokens=ids("ab"), ssm=None, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.0,
                     log_probs=[-0.5, -0.25]))
    first = response_arrays(greq(return_log_probs=True), "ab", stream, None)
    np.testing.assert_allclose(first["output_log_probs"], [[[-0.5, -0.25]]])
    assert first["output_tokens"].tolist() == [[b"a", b"b"]]
    stream.add(Round(tokens=ids("c"), ssm=None, drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.0,
                     log_probs=[-1.0]))
    second = response_arrays(greq(return_log_probs=True), "c", stream, "length")
    np.testing.assert_allclose(second["output_log_probs"], [[[-1.0]]])
    assert second["output_tokens"].tolist() == [[b"c"]]
    np.testing.assert_allclose(second["cum_log_probs"], [[-1.75]])
    assert "cum_log_probs" not in response_arrays(greq(), "c", stream, None)
