"""Bad-word bans in TensorRT-LLM's sense: a banned token *sequence* may never be completed.

A single-token bad word bans that token everywhere; a multi-token one bans its last token only when
the context already ends with the rest of it. Also converts to and from TensorRT-LLM's
`bad_words_list` tensor layout (row 0: flattened ids, row 1: end offsets padded with -1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BadWords:
    def __init__(self, words: Sequence[Sequence[int]]) -> None:
        self.words = [list(w) for w in words if len(w) > 0]

    def __bool__(self) -> bool:
        return bool(self.words)

    def banned_next(self, context: Sequence[int]) -> list[int]:
        """Token ids that must not follow `context`."""
        banned = []
        for word in self.words:
            head = word[:-1]
            if not head or (len(context) >= len(head) and list(context[len(context) - len(head):]) == head):
                banned.append(word[-1])
        return banned

    def to_tensor(self) -> np.ndarray:
        """TensorRT-LLM layout, shape [2, N] INT32."""
        flat = [t for w in self.words for t in w]
        offsets = list(np.cumsum([len(w) for w in self.words]))
        width = max(len(flat), 1)
        out = np.full((2, width), -1, dtype=np.int32)
        out[0, : len(flat)] = flat
        out[1, : len(offsets)] = offsets
        if not flat:
            out[0, 0] = 0
        return out

    @classmethod
    def from_tensor(cls, tensor: np.ndarray | None) -> "BadWords":
        if tensor is None or tensor.size == 0:
            return cls([])
        tensor = np.asarray(tensor).reshape(2, -1)
        ids, offsets = tensor[0], [int(o) for o in tensor[1] if o >= 0]
        words, start = [], 0
        for end in offsets:
            words.append([int(t) for t in ids[start:end]])
            start = end
        return cls(words)
