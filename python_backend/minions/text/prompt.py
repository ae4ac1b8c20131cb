"""Turning request text into prompt token ids (chat template for chat input)."""

from __future__ import annotations

import json

from minions.errors import InvalidRequest
from minions.text.surrogates import lone_surrogate, surrogate_message

CHAT_ROLES = ("system", "user", "assistant", "tool")


def chat_messages(text: str) -> list[dict]:
    """Chat input is either a JSON list of {role, content} messages or plain text from the user.

    Text that parses as a JSON list of objects is taken as messages and must be well formed (a
    non-empty list; each a role from CHAT_ROLES and string content; no lone UTF-16 surrogate, which a
    JSON escape can spell, anywhere); any other text, including text that merely opens with a bracket,
    is the user's message."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            messages = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError):  # not JSON, or nested deeper than the parser goes
            messages = None
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
            _check_messages(messages)
            return messages
    return [{"role": "user", "content": text}]


def _check_messages(messages: list[dict]) -> None:
    if not messages:
        raise InvalidRequest("chat 'text_input' is an empty list of messages: send at least one "
                             '{"role": "user", "content": "..."}')
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise InvalidRequest(f"chat message {i} has role {role!r}: use one of {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise InvalidRequest(f"chat message {i} has content of type {type(content).__name__}: content must be "
                                 "a string")
    if (where := lone_surrogate(messages)) is not None:  # JSON's "\ud800": the tokenizer cannot take it
        path, index = where
        message, _, field = path.partition(".")
        raise InvalidRequest(surrogate_message(f"chat message {message}" + (f", {field!r}" if field else ""), index))


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        try:
            text = tokenizer.apply_chat_template(chat_messages(text), add_generation_prompt=True, tokenize=False)
        except InvalidRequest:
            raise
        except Exception as exc:  # the template's own rules (e.g. role order): the client can fix them
            raise InvalidRequest(f"the model's chat template rejected the messages: {exc}") from None
    return list(tokenizer.encode(text, add_special_tokens=False))
