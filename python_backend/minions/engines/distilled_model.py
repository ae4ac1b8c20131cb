"""A distilled SSM: the LLM's embeddings, a few transformer layers and a reduced-vocabulary head.

Drafting cost on CPU is dominated by the output head (49152 x 576 for SmolLM2, about 7x one layer),
so the head only scores the `vocab` most frequent target tokens; the model still reads every token id.
It exposes the slice of the transformers API that TorchEngine uses (`config`, a call returning
`.logits` over the full vocabulary, DynamicCache-compatible), so it is served by the same engine as
the LLM. Tokens outside the reduced vocabulary get logit -inf: never drafted, probability 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "draft.safetensors"
MANIFEST_FILE = "manifest.json"


@dataclass
class DraftOutput:
    logits: torch.Tensor


class DistilledDraftModel(nn.Module):
    def __init__(self, config, vocab: torch.Tensor) -> None:
        from transformers import LlamaModel

        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.head = nn.Linear(config.hidden_size, int(vocab.numel()), bias=False)
        self.register_buffer("vocab", vocab.to(torch.long), persistent=True)

    @classmethod
    def from_teacher(cls, teacher, layers: list[int], vocab: torch.Tensor) -> DistilledDraftModel:
        """Initialise from the LLM: its embeddings, the given layers (in order), its final norm, and a
        head made of the embedding rows of `vocab` (SmolLM2 ties its head to its embeddings)."""
        import copy

        config = copy.deepcopy(teacher.config)
        config.num_hidden_layers = len(layers)
        if getattr(config, "layer_types", None):
            config.layer_types = [config.layer_types[i] for i in layers]
        draft = cls(config, vocab)
        base = teacher.model
        with torch.no_grad():
            draft.model.embed_tokens.weight.copy_(base.embed_tokens.weight)
            for dst, src in enumerate(layers):
                draft.model.layers[dst].load_state_dict(base.layers[src].state_dict())
            draft.model.norm.load_state_dict(base.norm.state_dict())
            draft.head.weight.copy_(teacher.get_output_embeddings().weight[vocab])
        return draft.eval()

    def sub_logits(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, logits_to_keep=0):
        """Logits over the reduced vocabulary only (what training and greedy drafting need)."""
        hidden = self.model(
            input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values, use_cache=use_cache
        ).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return self.head(hidden)

    def forward(self, input_ids, past_key_values=None, use_cache=False, logits_to_keep=0, attention_mask=None):
        sub = self.sub_logits(input_ids, attention_mask, past_key_values=past_key_values, use_cache=use_cache,
                              logits_to_keep=logits_to_keep)
        full = sub.new_full((*sub.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.vocab] = sub
        return DraftOutput(full)

    # -- persistence -------------------------------------------------------------------------------
    def save(self, out: Path, manifest: dict) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(out)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(out / WEIGHTS_FILE))
        (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))


def is_distilled_dir(path: Path) -> bool:
    return (path / WEIGHTS_FILE).exists() and (path / CONFIG_FILE).exists() and (path / MANIFEST_FILE).exists()


def load_draft_model(path: str | Path) -> DistilledDraftModel:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    path = Path(path)
    if not is_distilled_dir(path):
        raise FileNotFoundError(f"{path} is not a distilled SSM directory (run `make distill`)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    state = load_file(str(path / WEIGHTS_FILE))
    model = DistilledDraftModel(config, state["vocab"])
    model.load_state_dict(state)
    return model.eval()
