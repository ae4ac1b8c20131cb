"""Incremental detokenisation that never emits half a UTF-8 character.

Byte-level BPE splits multi-byte characters across tokens; decoding a prefix then ends in U+FFFD.
We decode a small window (as vLLM does: from `prefix_offset`, text up to `read_offset` already
emitted) and emit only once the window's text no longer ends in a replacement character.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the newly completed text (possibly empty)."""
        self.ids.extend(int(t) for t in new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset: self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset:])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of a sequence: whatever is left, replacement characters included."""
        prefix_text = self._decode(self.ids[self.prefix_offset: self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset:])
        delta = full_text[len(prefix_text):]
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta
