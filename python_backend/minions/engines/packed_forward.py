"""Forward passes over several sequences at once, each with its own KV cache (batched verification).

Two implementations of one small interface (`ForwardBackend`):

- `PackedLlamaForward` (Llama-family models, e.g. SmolLM2): the new tokens of every sequence in a batch
  are concatenated into one [T, hidden] matrix, so every linear layer (projections, MLP, head) runs once
  over all of them and no row is padding. The KV caches live in one paged pool (KvPool: blocks of
  BLOCK_TOKENS positions; a sequence's state is its block ids and length, so cropping rejected draft
  tokens is moving the length back), and attention runs once per layer over all the step's rows (twice
  when a long prefill shares the step: step_plan.py): each row's keys gathered from its blocks, its
  queries padded to the step's widest row, a mask keeping each query to its own positions. A step then
  dispatches as many operators for 16 rows with 16-token drafts as for one plain token
  (benchmarks/bench_forward_ops.py), which a GPU needs and CUDA graphs build on.
- `SerialForward` (any other transformers model, e.g. the distilled SSMs): one DynamicCache per sequence,
  sequences run one after another. Correct for every model, batched in name only.

Why the CPU case matters: a one-token fp32 pass of SmolLM2 is memory-bound (streaming the weights),
so a batch of rows shares that cost; longer rows are compute-bound, so batching verification saves the
weight streaming, not the arithmetic (docs/engines.md).
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from minions.engines.graph_plan import Bucket, DenseStep, dense_step
from minions.engines.kv_pool import BLOCK_TOKENS, SCRATCH_BLOCK, KvPool, PagedKv
from minions.engines.sequence_cache import kv_bytes_per_token
from minions.engines.step_plan import AttentionGroup, RowSpec, plan_step



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


class StepRunner(Protocol):
    """Where PackedLlamaForward sends a step that fits a bucket (cuda_graphs.py: eagerly, or a CUDA graph)."""

    def bucket(self, rows: list[RowSpec], pool: KvPool) -> Bucket | None:
        """The step's bucket; None: the forward runs it eagerly."""
        ...

    def run(self, step: DenseStep) -> torch.Tensor:
        """The step's final hidden states, [rows * width, hidden]."""
        ...


class PackedLlamaForward:
    """Packed forward over ragged rows for LlamaForCausalLM-shaped models (see the module docstring)."""

    def __init__(self, model, pool_blocks: int = 8) -> None:
        """`pool_blocks`: the KV pool's first size (it doubles when short; CUDA graphs want it sized once)."""
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
        self.pool = KvPool(len(self.layers), self.kv_heads, head_dim=self.head_dim, dtype=self.dtype,
                           device=self.device, blocks=pool_blocks)
        self.runner: StepRunner | None = None
        """Where a step that fits one of its buckets runs (cuda_graphs.py); None: every step eagerly."""
        self._rope = apply_rotary_pos_emb

    @staticmethod
    def supports(model) -> bool:
        """Llama-shaped: the layers, norms and rotary embedding this class calls, and nothing else."""
        from transformers.models.llama.modeling_llama import LlamaForCausalLM

        return type(model) is LlamaForCausalLM

    def new_state(self) -> PagedKv:
        return PagedKv(self.pool, self.kv_bytes_per_token)

    def length(self, state: PagedKv) -> int:
        return state.length

    def crop(self, state: PagedKv, length: int) -> None:
        state.length = min(state.length, length)

    def copy_prefix(self, state: PagedKv, length: int) -> PagedKv:
        copy = self.new_state()
        copy.reserve(length)
        if copy.blocks:
            self.pool.copy(state.blocks[: len(copy.blocks)], copy.blocks)
        copy.length = length
        return copy

    def state_bytes(self, state: PagedKv) -> int:
        return state.capacity_bytes()

    def projected_bytes(self, state: PagedKv, length: int) -> int:
        return state.capacity_for(length) * self.kv_bytes_per_token

    @torch.inference_mode()
    def forward(self, rows: list[ForwardRow]) -> list[np.ndarray]:
        for r in rows:
            r.state.reserve(r.state.length + len(r.new_tokens))
        specs = [RowSpec(r.state.length, len(r.new_tokens), tuple(r.state.blocks)) for r in rows]
        bucket = self.runner.bucket(specs, self.pool) if self.runner is not None else None
        if bucket is None:
            return self._eager(rows, specs)
        step = dense_step(specs, [r.new_tokens for r in rows], n_logits=[r.n_logits for r in rows], bucket=bucket,
                          block_tokens=BLOCK_TOKENS, scratch_block=SCRATCH_BLOCK)
        hidden = self.runner.run(step)
        for r in rows:
            r.state.length += len(r.new_tokens)
        keep = torch.from_numpy(np.concatenate(step.logit_rows)).to(self.device)
        return self._logits(hidden.index_select(0, keep), [r.n_logits for r in rows])

    def dense_hidden(self, ids: torch.Tensor, positions: torch.Tensor, writes: torch.Tensor, gather: torch.Tensor,
                     mask: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        """A step laid out in a bucket (graph_plan.DenseStep, as tensors): the final normed hidden state of
        every token slot, [rows * width, hidden] (the head runs on the wanted rows alone, outside). Fixed
        shapes and no host synchronisation, so that a CUDA graph can capture it."""
        span, flat = gather.shape[1], gather.reshape(-1)

        def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            queries = q.reshape(rows, width, self.heads, self.head_dim).transpose(1, 2)
            k = keys.index_select(0, flat).view(rows, span, self.kv_heads, self.head_dim).transpose(1, 2)
            v = values.index_select(0, flat).view(rows, span, self.kv_heads, self.head_dim).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(queries, k, v, attn_mask=mask, scale=self.scaling,
                                                                   enable_gqa=self.groups > 1)
            return out.transpose(1, 2).reshape(rows * width, self.heads * self.head_dim)

        return self.inner.norm(self._layers(ids, positions, writes, attend)[0])

    def _eager(self, rows: list[ForwardRow], specs: list[RowSpec]) -> list[np.ndarray]:
        """A step as it comes: packed tokens, attention per group of rows (step_plan.py)."""
        plan = plan_step(specs, BLOCK_TOKENS)
        device = self.device
        ids = torch.tensor([t for r in rows for t in r.new_tokens], dtype=torch.long, device=device)
        groups = [_GroupTensors.of(g, device) for g in plan.groups]
        h = self._layers(ids, torch.from_numpy(plan.positions).to(device), torch.from_numpy(plan.writes).to(device),
                         lambda q, keys, values: self._attend(q, keys, values=values, groups=groups,
                                                              total=ids.shape[0]))
        for r in rows:
            r.state.length += len(r.new_tokens)
        sizes = [len(r.new_tokens) for r in rows]
        ends = np.cumsum(sizes)
        keep = torch.tensor([i for e, r in zip(ends, rows) for i in range(e - r.n_logits, e)], dtype=torch.long,
                            device=device)
        return self._logits(self.inner.norm(h[0, keep]), [r.n_logits for r in rows])

    def _logits(self, hidden: torch.Tensor, counts: list[int]) -> list[np.ndarray]:
        """The head over the wanted rows' final hidden states, split per step row (`counts` rows each)."""
        logits = self.model.lm_head(hidden).float().cpu().numpy()
        bounds = np.cumsum([0] + counts)
        return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, writes: torch.Tensor, attend) -> torch.Tensor:
        """The decoder layers over packed tokens [T]: each layer writes the tokens' keys and values to the
        pool at `writes`, then `attend(q [T, heads, d], keys, values)` gives [T, heads * d]. h [1, T, hidden]."""
        total = ids.shape[0]
        h = self.inner.embed_tokens(ids)[None]
        cos, sin = self.inner.rotary_emb(h, positions[None])
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, total, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, total, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, total, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            keys, values = self.pool.keys[index], self.pool.values[index]
            keys.index_copy_(0, writes, k[0].transpose(0, 1))
            values.index_copy_(0, writes, v[0].transpose(0, 1))
            h = h + attn.o_proj(attend(q[0].transpose(0, 1), keys, values)[None])
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, groups: list[_GroupTensors],
                total: int) -> torch.Tensor:
        """q [T, heads, d] of the packed tokens over the pool's keys/values [P, kv_heads, d]: one SDPA per
        group, each row padded to the group's width and span; out [T, heads * d]."""
        width = self.heads * self.head_dim
        if len(groups) == 1 and groups[0].in_order:
            return self._attend_group(q, keys, values, groups[0])
        out = q.new_empty(total, width)
        for g in groups:
            out.index_copy_(0, g.tokens, self._attend_group(q.index_select(0, g.tokens), keys, values, g))
        return out

    def _attend_group(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      g: _GroupTensors) -> torch.Tensor:
        """One group's tokens q [T_g, heads, d] -> [T_g, heads * d]."""
        rows, n, span = g.gather.shape[0], g.width, g.gather.shape[1]
        padded = q.new_zeros(rows * n, self.heads, self.head_dim).index_copy_(0, g.dest, q)
        padded = padded.view(rows, n, self.heads, self.head_dim).transpose(1, 2)
        # [rows, kv_heads, span, d]; index_select copies whole [kv_heads, d] rows (advanced indexing: 3x slower)
        k = keys.index_select(0, g.gather.view(-1)).view(rows, span, self.kv_heads, self.head_dim).transpose(1, 2)
        v = values.index_select(0, g.gather.view(-1)).view(rows, span, self.kv_heads, self.head_dim).transpose(1, 2)
        # enable_gqa: each KV head serves its query group in place (no repeated copy of the keys)
        out = torch.nn.functional.scaled_dot_product_attention(padded, k, v, attn_mask=g.mask, scale=self.scaling,
                                                               enable_gqa=self.groups > 1)
        return out.transpose(1, 2).reshape(rows * n, self.heads * self.head_dim).index_select(0, g.dest)


@dataclass
class _GroupTensors:
    """An AttentionGroup's indices on the model's device."""

    width: int
    tokens: torch.Tensor
    dest: torch.Tensor
    gather: torch.Tensor
    mask: torch.Tensor
    in_order: bool
    """The group's tokens are the whole step, in order (no gather or scatter of its queries needed)."""

    @classmethod
    def of(cls, g: AttentionGroup, device: torch.device) -> "_GroupTensors":
        in_order = bool(np.array_equal(g.tokens, np.arange(g.tokens.size)))
        return cls(g.width, torch.from_numpy(g.tokens).to(device), dest=torch.from_numpy(g.dest).to(device),
                   gather=torch.from_numpy(g.gather).to(device), mask=torch.from_numpy(g.mask).to(device),
                   in_order=in_order)


def forward_backend(model, pool_bytes: int = 0) -> ForwardBackend:
    """The packed backend where the model is Llama-shaped (its KV pool sized for `pool_bytes` at first),
    the serial one otherwise."""
    if not PackedLlamaForward.supports(model):
        return SerialForward(model)
    blocks = 1 + pool_bytes // (BLOCK_TOKENS * kv_bytes_per_token(model.config.to_dict()))
    return PackedLlamaForward(model, max(blocks, 8))
