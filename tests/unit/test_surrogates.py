"""minions.text.surrogates: lone UTF-16 surrogates found in JSON values and in UTF-8-like bytes, and the
one message every refusal of them carries (the `minions` model's inputs and chat messages, the OpenAI
frontend's bodies)."""

from __future__ import annotations

from minions.text.surrogates import encoded_surrogate, lone_surrogate, surrogate_message


def test_a_surrogate_written_as_utf8_like_bytes_is_found_by_its_character():
    assert encoded_surrogate("ab\udc00".encode("utf-8", "surrogatepass")) == 2
    assert encoded_surrogate("é\ud800x".encode("utf-8", "surrogatepass")) == 1, "characters, not bytes"
    assert encoded_surrogate("\ud83d\ude00".encode("utf-8", "surrogatepass")) == 0, "a pair written apart (CESU-8)"


def test_bytes_that_are_not_utf8_for_another_reason_hold_no_surrogate():
    assert encoded_surrogate(b"caf\xe9") is None
    assert encoded_surrogate(b"\xff" + "\ud800".encode("utf-8", "surrogatepass")) is None
    assert encoded_surrogate("ok \U0001f600".encode()) is None


def test_a_lone_surrogate_is_found_in_a_json_value_by_its_path():
    assert lone_surrogate([{"role": "user", "content": "a\ud800"}]) == ("0.content", 1)
    assert lone_surrogate([{"role": "user", "content": "\U0001f600"}]) is None


def test_the_message_names_the_text_and_the_character():
    assert surrogate_message("input 'text_input'", 3) == ("input 'text_input': a lone UTF-16 surrogate at character 3 "
                                                          "is not Unicode text; send text that UTF-8 can encode")
