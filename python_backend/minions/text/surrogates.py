"""Finding lone UTF-16 surrogates (U+D800..U+DFFF) in text a client sent.

JSON can spell one (`"\\ud800"`) and some encoders write one as UTF-8-like bytes (`ED A0 80`, what a
JSON parser makes of `"\\udc00"`), but it is not Unicode text: UTF-8 cannot encode it, and the
tokenizer fails on it with a TypeError. The `minions` model's inputs and chat messages and the OpenAI
frontend's bodies refuse such text with this module's message instead.
"""

from __future__ import annotations

from typing import Any


def surrogate_message(where: str, index: int) -> str:
    """The client's message for a lone surrogate at character `index` of the text `where` names."""
    return f"{where}: a lone UTF-16 surrogate at character {index} is not Unicode text; send text that UTF-8 can encode"


def lone_surrogate(value: Any) -> tuple[str, int] | None:
    """Where a JSON value holds a string with a lone UTF-16 surrogate: (its path, e.g.
    `messages.0.content`, and the character's index), or None. Iterative: the value may nest deep."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return path, exc.start
        elif isinstance(item, dict):
            pending += [(f"{path}.{key}".lstrip("."), v) for key, v in reversed(item.items())]
            pending += [(path, key) for key in item]  # a key is part of the text too
        elif isinstance(item, list):
            pending += [(f"{path}.{i}".lstrip("."), v) for i, v in reversed(list(enumerate(item)))]
    return None


def encoded_surrogate(raw: bytes) -> int | None:
    """The character index of the first surrogate in bytes that are UTF-8 but for surrogates written
    as three-byte sequences; None for bytes that are not UTF-8 for another reason."""
    try:
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
