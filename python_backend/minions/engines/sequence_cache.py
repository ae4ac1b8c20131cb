"""Per-sequence engine state (a KV cache and the tokens it holds), keyed by request id.

The orchestrator resends the whole sequence every round, as TensorRT-LLM's draft-target BLS does; an
engine finds the entry of the request, keeps the longest common prefix of what it cached and what it
is sent, and computes only the rest. Entries leave on an explicit release (request finished) or, least
recently used first, when the table is full.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

State = TypeVar("State")

KV_GROWTH_TOKENS = 128
"""The torch engine's KV buffers grow by this many positions at a time (few copies, at most 127
unused positions per sequence); the orchestrator's KV admission counts in the same chunks."""


def kv_bytes_per_token(config: Mapping) -> int:
    """fp32 K and V of every layer for one position, from a transformers config (as a dict)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * 4


@dataclass
class CachedSequence(Generic[State]):
    state: State
    tokens: list[int] = field(default_factory=list)


class SequenceCache(Generic[State]):
    """LRU table of CachedSequence entries with a fixed number of slots."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, CachedSequence[State]] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def get(self, request_id: str) -> CachedSequence[State] | None:
        entry = self._entries.get(request_id)
        if entry is not None:
            self._entries.move_to_end(request_id)
        return entry

    def put(self, request_id: str, entry: CachedSequence[State]) -> list[CachedSequence[State]]:
        """Insert (or replace) an entry; returns entries evicted to make room."""
        self._entries[request_id] = entry
        self._entries.move_to_end(request_id)
        evicted = []
        while len(self._entries) > self.capacity:
            _, old = self._entries.popitem(last=False)
            evicted.append(old)
            self.evictions += 1
        return evicted

    def pop_oldest(self, keep: Container[str] = ()) -> CachedSequence[State] | None:
        """Evict the least recently used entry whose id is not in `keep` (entries in use); None if none."""
        request_id = next((rid for rid in self._entries if rid not in keep), None)
        return None if request_id is None else self.evict(request_id)

    def evict(self, request_id: str) -> CachedSequence[State] | None:
        """Remove an entry for lack of room (counted, unlike a release)."""
        entry = self._entries.pop(request_id, None)
        self.evictions += entry is not None
        return entry

    def release(self, request_id: str) -> CachedSequence[State] | None:
        return self._entries.pop(request_id, None)

    def items(self) -> list[tuple[str, CachedSequence[State]]]:
        """(request id, entry) pairs, least recently used first."""
        return list(self._entries.items())

    def cached_tokens(self) -> int:
        return sum(len(e.tokens) for e in self._entries.values())
