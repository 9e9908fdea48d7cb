"""A cheap draft made from the target itself: a few of its decoder layers, its embeddings, and an
output head over the most frequent tokens only.

Only what training changes is shipped: low-rank (LoRA) deltas of the chosen layers' projections and
of the head, the norms, and the head's token list. Everything else (embeddings, the base weights of
those layers) is read from the target checkpoint at load time, so the file stays a few MB.
Verification stays exact over the full vocabulary: the draft merely never proposes a rare token.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from torch import nn

from ..config import EMBEDDED_DRAFT, ModelConfig
from ..models.llama import LlamaModel
from ..models.loader import TORCH_DTYPES, read_checkpoint

SHIPPED = os.path.join(os.path.dirname(__file__), "weights", "smollm2-135m-instruct-draft.safetensors")
LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class DraftLayout:
    target_path: str
    layers: list[int]  # target layers the draft's layers start from, in order
    head_vocab: list[int]  # token ids the head covers, most frequent first
    rank: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DraftLayout":
        return cls(**json.loads(text))


class LoRALinear(nn.Module):
    """y = base(x) + (x A^T) B^T, A, B low rank; B starts at zero so training starts from the base."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) / base.in_features**0.5)
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t()

    def merged(self) -> nn.Linear:
        with torch.no_grad():
            self.base.weight += self.lora_b @ self.lora_a
        return self.base


def base_draft(layout: DraftLayout, max_len: int, parts=None) -> LlamaModel:
    """The untrained draft: the layout's target layers, the target's final norm, a head over
    `head_vocab` initialised from the target's output embedding rows."""
    hf_config, spec, sd = parts or read_checkpoint(layout.target_path)
    renamed = {k: v for k, v in sd.items() if not k.startswith("model.layers.")}
    for j, i in enumerate(layout.layers):
        prefix = f"model.layers.{i}."
        renamed.update({f"model.layers.{j}." + k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    draft_spec = dataclasses.replace(spec, num_layers=len(layout.layers))
    return LlamaModel(draft_spec, hf_config, renamed, max_len=max_len, head_vocab=layout.head_vocab)


def add_lora(model: LlamaModel, rank: int) -> list[nn.Parameter]:
    """Wrap every projection of every layer and the head in LoRA; returns the trainable parameters
    (LoRA factors and RMSNorm weights). Embeddings stay frozen (shared with the target)."""
    model.requires_grad_(False)
    params: list[nn.Parameter] = []
    for layer in model.layers:
        for name in LINEARS:
            wrapped = LoRALinear(getattr(layer, name), rank)
            setattr(layer, name, wrapped)
            params += [wrapped.lora_a, wrapped.lora_b]
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.requires_grad_(True)
            params.append(norm.weight)
    model.lm_head = LoRALinear(model.lm_head, rank)
    params += [model.lm_head.lora_a, model.lm_head.lora_b]
    model.norm.weight.requires_grad_(True)
    params.append(model.norm.weight)
    return params


def trained_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The draft's own tensors: LoRA factors and norms (what `save_draft` writes)."""
    return {k: v.detach().float().contiguous() for k, v in model.state_dict().items() if "lora_" in k or "norm" in k}


def save_draft(model: LlamaModel, layout: DraftLayout, path: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tensors = {k: v.to(torch.bfloat16) if "lora_" in k else v for k, v in trained_tensors(model).items()}
    save_file(tensors, path, metadata={"layout": layout.to_json()})


def load_draft(path: str, config: ModelConfig, target_parts=None) -> LlamaModel:
    """Rebuild a shipped draft: base layers from the target, LoRA merged in, on config's device/dtype."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if path == EMBEDDED_DRAFT:
        path = SHIPPED
    if not os.path.isfile(path):
        raise FileNotFoundError(f"draft weights not found: {path} (train them: python -m adaserve_backend.draft.train)")
    with safe_open(path, "pt") as f:
        layout = DraftLayout.from_json(f.metadata()["layout"])
    model = base_draft(layout, config.max_model_len, target_parts)
    add_lora(model, layout.rank)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in load_file(path).items()}, strict=False)
    if unexpected or any("lora_" in k or "norm" in k for k in missing):
        raise ValueError(f"{path} does not match its layout: missing {missing[:4]}, unexpected {unexpected[:4]}")
    merge_lora(model)
    return model.place(config.device, TORCH_DTYPES[config.dtype]).eval()


def merge_lora(model: LlamaModel) -> None:
    for layer in model.layers:
        for name in LINEARS:
            module = getattr(layer, name)
            if isinstance(module, LoRALinear):
                setattr(layer, name, module.merged())
    if isinstance(model.lm_head, LoRALinear):
        model.lm_head = model.lm_head.merged()
    model.requires_grad_(False)
