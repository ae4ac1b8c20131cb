"""Forward passes over several sequences at once, each with its own KV cache (batched verification).

Two implementations of one small interface (`ForwardBackend`):

- `PackedLlamaForward` (Llama-family models, e.g. SmolLM2): the new tokens of every sequence in a batch
  are concatenated into one [T, hidden] matrix, so every linear layer (projections, MLP, head) runs once
  over all of them and no row is padding; only attention is done per sequence, against that sequence's
  own cache. This is the varlen ("ragged") layout of vLLM's CPU attention: drafts of different lengths
  cost exactly their tokens, so SPIN's request decomposition has nothing left to remove. The per-layer
  caches are growable [kv_heads, capacity, head_dim] buffers, so cropping rejected draft tokens is just
  moving the length back.
- `SerialForward` (any other transformers model, e.g. the distilled SSMs): one DynamicCache per sequence,
  sequences run one after another. Correct for every model, batched in name only.

Why the CPU case matters: a one-token fp32 pass of SmolLM2 is memory-bound (~50 ms to stream the
weights), so a batch shares that cost. Measured, one thread, 60-token caches: 8 one-token rows take
112 ms against 70 ms for one. Longer rows are compute-bound: 8 drafts of 9 tokens take 460 ms against
116 ms for one, so batching verification saves the weight streaming, not the arithmetic.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from minions.engines.sequence_cache import KV_GROWTH_TOKENS, kv_bytes_per_token


@dataclass
class ForwardRow:
    """One sequence's part of a batched pass."""

    state: object
    """The sequence's cache (the backend's own type); already cropped to the tokens it keeps."""
    new_tokens: list[int]
    n_logits: int
    """Logits wanted for the last n_logits of new_tokens."""


class ForwardBackend(Protocol):
    def new_state(self) -> object: ...

    def length(self, state: object) -> int: ...

    def crop(self, state: object, length: int) -> None: ...

    def copy_prefix(self, state: object, length: int) -> object:
        """A new state holding the first `length` positions of `state` (which is left as it was)."""
        ...

    def state_bytes(self, state: object) -> int: ...

    def projected_bytes(self, state: object, length: int) -> int:
        """What the state will occupy once it holds `length` positions."""
        ...

    def forward(self, rows: list[ForwardRow]) -> list[np.ndarray]: ...


class SerialForward:
    """DynamicCache per sequence; a batch is run one sequence at a time (works for any causal LM)."""

    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.kv_bytes_per_token = kv_bytes_per_token(model.config.to_dict())

    def new_state(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def length(self, state) -> int:
        return int(state.get_seq_length())

    def crop(self, state, length: int) -> None:
        current = state.get_seq_length()
        if length < current:
            state.crop(-(current - length))  # transformers 5: positive lengths raise

    def copy_prefix(self, state, length: int):
        copy = deepcopy(state)
        self.crop(copy, length)
        return copy

    def state_bytes(self, state) -> int:
        return self.projected_bytes(state, self.length(state))

    def projected_bytes(self, state, length: int) -> int:
        return length * self.kv_bytes_per_token

    @torch.inference_mode()
    def forward(self, rows: list[ForwardRow]) -> list[np.ndarray]:
        out = []
        for row in rows:
            logits = self.model(
                input_ids=torch.tensor([row.new_tokens], dtype=torch.long, device=self.device),
                past_key_values=row.state,
                use_cache=True,
                logits_to_keep=row.n_logits,
            ).logits
            out.append(logits[0, -row.n_logits:].float().cpu().numpy())
        return out


class SlotKv:
    """One sequence's KV cache for every layer: growable buffers and the number of valid positions."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.keys = [torch.empty(kv_heads, 0, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(kv_heads, 0, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0

    def capacity_for(self, length: int) -> int:
        capacity = self.keys[0].shape[1]
        return capacity if length <= capacity else -(-length // KV_GROWTH_TOKENS) * KV_GROWTH_TOKENS

    def reserve(self, length: int) -> None:
        """Make room for `length` positions."""
        capacity = self.capacity_for(length)
        if capacity == self.keys[0].shape[1]:
            return
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                grown = old.new_empty(old.shape[0], capacity, old.shape[2])
                grown[:, : self.length] = old[:, : self.length]
                store[i] = grown

    def capacity_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PackedLlamaForward:
    """Packed forward over ragged rows for LlamaForCausalLM-shaped models (see the module docstring)."""

    def __init__(self, model) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.model = model
        self.inner = model.model
        config = model.config
        self.layers = list(self.inner.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.groups = attn.num_key_value_groups
        self.scaling = attn.scaling
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.kv_bytes_per_token = kv_bytes_per_token(config.to_dict())
        self._rope = apply_rotary_pos_emb

    @staticmethod
    def supports(model) -> bool:
        """Llama-shaped: the layers, norms and rotary embedding this class calls, and nothing else."""
        from transformers.models.llama.modeling_llama import LlamaForCausalLM

        return type(model) is LlamaForCausalLM

    def new_state(self) -> SlotKv:
        return SlotKv(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    def length(self, state: SlotKv) -> int:
        return state.length

    def crop(self, state: SlotKv, length: int) -> None:
        state.length = min(state.length, length)

    def copy_prefix(self, state: SlotKv, length: int) -> SlotKv:
        copy = self.new_state()
        copy.reserve(length)
        for mine, theirs in zip((*copy.keys, *copy.values), (*state.keys, *state.values)):
            mine[:, :length] = theirs[:, :length]
        copy.length = length
        return copy

    def state_bytes(self, state: SlotKv) -> int:
        return state.capacity_bytes()

    def projected_bytes(self, state: SlotKv, length: int) -> int:
        return state.capacity_for(length) * self.kv_bytes_per_token

    @torch.inference_mode()
    def forward(self, rows: list[ForwardRow]) -> list[np.ndarray]:
        starts = [r.state.length for r in rows]
        sizes = [len(r.new_tokens) for r in rows]
        ids = torch.tensor([t for r in rows for t in r.new_tokens], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(s, s + n, device=self.device) for s, n in zip(starts, sizes)])[None]
        for r, s, n in zip(rows, starts, sizes):
            r.state.reserve(s + n)
        h = self.inner.embed_tokens(ids)[None]  # [1, T, hidden]
        cos, sin = self.inner.rotary_emb(h, positions)
        total = ids.shape[0]
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, total, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, total, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, total, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            out = torch.empty(1, self.heads, total, self.head_dim, dtype=q.dtype, device=self.device)
            offset = 0
            for r, start, n in zip(rows, starts, sizes):
                keys, values = r.state.keys[index], r.state.values[index]
                keys[:, start : start + n] = k[0, :, offset : offset + n]
                values[:, start : start + n] = v[0, :, offset : offset + n]
                out[0, :, offset : offset + n] = self._attend(
                    q[0, :, offset : offset + n], keys[:, : start + n], values[:, : start + n], start
                )
                offset += n
            attn_out = attn.o_proj(out.transpose(1, 2).reshape(1, total, self.heads * self.head_dim))
            h = h + attn_out
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        for r, s, n in zip(rows, starts, sizes):
            r.state.length = s + n
        ends = np.cumsum(sizes)
        keep = torch.tensor([i for e, r in zip(ends, rows) for i in range(e - r.n_logits, e)], dtype=torch.long,
                            device=self.device)
        logits = self.model.lm_head(self.inner.norm(h[0, keep])).float().cpu().numpy()
        bounds = np.cumsum([0] + [r.n_logits for r in rows])
        return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int) -> torch.Tensor:
        """q [heads, n, d] over keys/values [kv_heads, past + n, d]: new token i sees positions <= past + i."""
        n = q.shape[1]
        mask = None
        if n > 1:
            mask = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(diagonal=past)
        # enable_gqa: each KV head serves its query group in place (no repeated copy of the cache per layer)
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling,
                                                                enable_gqa=self.groups > 1)


def forward_backend(model) -> ForwardBackend:
    """The packed backend where the model is Llama-shaped, the serial one otherwise."""
    return PackedLlamaForward(model) if PackedLlamaForward.supports(model) else SerialForward(model)
