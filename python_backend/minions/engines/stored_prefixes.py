"""Finished sequences' KV kept for later requests, least recently used first, within a byte budget
(llama-server's `--cache-ram`): the store behind both engines' automatic prefix caching.

A new request looks for the stored sequence sharing the longest token prefix with it and starts from
that prefix's KV instead of prefilling it. One that a newer stored sequence extends (a conversation's
earlier turn) is dropped. The engine decides what a `blob` is (llama.cpp: its cells copied to host
memory; torch: the sequence's own KV buffers) and what it weighs; this is the bookkeeping alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from minions.decoding.tokens import common_prefix_len, longest_shared


@dataclass(eq=False)
class StoredPrefix:
    """A finished sequence's tokens and its KV (the engine's blob, `size` bytes)."""

    tokens: list[int]
    blob: object
    size: int


class StoredPrefixes:
    """Stored prefixes, least recently used first, at most `capacity_bytes` together."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._stored: list[StoredPrefix] = []

    def __len__(self) -> int:
        return len(self._stored)

    def __iter__(self) -> Iterator[StoredPrefix]:
        return iter(self._stored)

    def size(self) -> int:
        """Bytes the stored prefixes take."""
        return sum(s.size for s in self._stored)

    def add(self, tokens: list[int], blob: object, size: int) -> None:
        """Keep a finished sequence: the stored prefixes it extends go, then the least recently used ones
        beyond the budget. One larger than the whole budget is not kept."""
        if size > self.capacity_bytes:
            return
        self._stored = [s for s in self._stored if common_prefix_len(s.tokens, tokens) < len(s.tokens)]
        self._stored.append(StoredPrefix(list(tokens), blob, size))
        while self.size() > self.capacity_bytes:
            self._stored.pop(0)

    def longest(self, tokens: list[int]) -> tuple[StoredPrefix | None, int]:
        """The stored prefix sharing the most leading tokens with `tokens`, and how many (None, 0: none)."""
        return longest_shared(((s, s.tokens) for s in self._stored), tokens)

    def touch(self, stored: StoredPrefix) -> None:
        """Mark a stored prefix most recently used (a request started from it)."""
        self._stored.remove(stored)
        self._stored.append(stored)

    def take(self, stored: StoredPrefix) -> StoredPrefix:
        """Remove a stored prefix (its blob handed to a request, or freed)."""
        self._stored.remove(stored)
        return stored

    def pop_oldest(self) -> StoredPrefix | None:
        """Remove the least recently used stored prefix (None when there is none)."""
        return self._stored.pop(0) if self._stored else None
