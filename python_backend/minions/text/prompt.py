"""Turning request text into prompt token ids (chat template for chat input)."""

from __future__ import annotations

import json


def chat_messages(text: str) -> list[dict]:
    """Chat input is either a JSON list of {role, content} messages or plain text from the user."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            messages = json.loads(stripped)
        except json.JSONDecodeError:
            messages = None
        if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            return messages
    return [{"role": "user", "content": text}]


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        text = tokenizer.apply_chat_template(chat_messages(text), add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))
