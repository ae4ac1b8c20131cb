"""The torch engine's KV caches: one pool of fixed-size blocks for every sequence (per layer, keys and
values), and a sequence's state as the block ids it holds. PackedLlamaForward writes a step's keys and
values into the pool and gathers each row's from it (packed_forward.py, step_plan.py)."""

from __future__ import annotations

import weakref

import torch

from minions.engines.sequence_cache import KV_GROWTH_TOKENS

BLOCK_TOKENS = KV_GROWTH_TOKENS
"""Positions per pool block: the step in which the KV budget already counts a sequence's growth."""
SCRATCH_BLOCK = 0


class KvPool:
    """Every layer's keys and values in blocks of BLOCK_TOKENS positions: one tensor per layer and kind,
    [blocks * BLOCK_TOKENS, kv_heads, head_dim], zeroed (a padded gather reads finite numbers). A sequence
    holds block ids (PagedKv); the pool doubles when it runs short (`grown` counts it: captured CUDA
    graphs hold the old tensors), and a sequence's blocks return to it when the sequence is dropped.
    Block SCRATCH_BLOCK is no sequence's: a padded step writes its padding there."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", blocks: int = 8) -> None:
        blocks = max(blocks, 2)
        self.keys = [torch.zeros(blocks * BLOCK_TOKENS, kv_heads, head_dim, dtype=dtype, device=device)
                     for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.free: list[int] = [b for b in range(blocks - 1, -1, -1) if b != SCRATCH_BLOCK]
        self.grown = 0

    @property
    def blocks(self) -> int:
        return self.keys[0].shape[0] // BLOCK_TOKENS

    def allocate(self, count: int) -> list[int]:
        if count > len(self.free):
            self._grow(count - len(self.free))
        return [self.free.pop() for _ in range(count)]

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)

    def copy(self, source: list[int], target: list[int]) -> None:
        """Copy whole blocks, every layer."""
        offsets = torch.arange(BLOCK_TOKENS, device=self.keys[0].device)
        src = (torch.tensor(source, device=offsets.device)[:, None] * BLOCK_TOKENS + offsets).reshape(-1)
        dst = (torch.tensor(target, device=offsets.device)[:, None] * BLOCK_TOKENS + offsets).reshape(-1)
        for store in (self.keys, self.values):
            for tensor in store:
                tensor.index_copy_(0, dst, tensor.index_select(0, src))

    def _grow(self, at_least: int) -> None:
        old = self.blocks
        new = max(2 * old, old + at_least)
        for store in (self.keys, self.values):
            for i, tensor in enumerate(store):
                grown = tensor.new_zeros(new * BLOCK_TOKENS, *tensor.shape[1:])
                grown[: tensor.shape[0]] = tensor
                store[i] = grown
        self.free[:0] = range(new - 1, old - 1, -1)
        self.grown += 1


class PagedKv:
    """One sequence's KV cache: its blocks in the pool (returned when the state is dropped) and the number
    of valid positions. Cropping moves the length back and keeps the blocks, as a growable buffer would."""

    def __init__(self, pool: KvPool, bytes_per_token: int) -> None:
        self.pool = pool
        self.bytes_per_token = bytes_per_token
        self.blocks: list[int] = []
        self.length = 0
        weakref.finalize(self, pool.release, self.blocks)

    def capacity_for(self, length: int) -> int:
        capacity = len(self.blocks) * BLOCK_TOKENS
        return capacity if length <= capacity else -(-length // BLOCK_TOKENS) * BLOCK_TOKENS

    def reserve(self, length: int) -> None:
        """Make room for `length` positions."""
        missing = -(-length // BLOCK_TOKENS) - len(self.blocks)
        if missing > 0:
            self.blocks.extend(self.pool.allocate(missing))

    def capacity_bytes(self) -> int:
        return len(self.blocks) * BLOCK_TOKENS * self.bytes_per_token
