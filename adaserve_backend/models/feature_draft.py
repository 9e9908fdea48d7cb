"""The project's draft: a feature-conditioned draft made from the target itself, in two layouts.

EAGLE-3 (Li et al., 2025; `feature_layers` set, the default since it was trained): each draft token i
reads its embedding and a feature: at the chain, the target's residual stream entering a low, a
middle and a high layer at position i-1, concatenated and fused by a linear 3h -> h; deeper in a tree,
the draft's own output state at the node's parent (already h wide, so not fused). One decoder layer
takes [norm(embedding), norm(feature)] into its attention projections, keeps the feature as its
residual stream, and its output is both the next level's feature and, through the final norm and the
target's output head restricted to the tokens the target emits most (a reduced draft vocabulary),
the draft's next-token distribution. Trained with training-time test (tools/draft/ttt.py).

EAGLE-1-style (no `feature_layers`, the earlier shipped draft): the feature is the target's final
hidden state, added to the embedding through a linear h -> h before standard decoder layers.

Only what training changes is shipped (fusion, decoder layer, norms, the head's token list);
embeddings and head rows are read from the target checkpoint at load time, so the file stays small.
Verification stays exact over the full vocabulary: the draft merely never proposes a rare token.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from torch import nn

from ..attention.backend import AttentionBackend
from ..config import EMBEDDED_DRAFT, ModelConfig
from .fused_layer import fused_stack
from .linear import Linear
from .llama import DecoderLayer, LlamaModel, RMSNorm
from .loader import TORCH_DTYPES, read_checkpoint

SHIPPED = os.path.join(os.path.dirname(__file__), "weights", "smollm2-135m-instruct-draft.safetensors")
SHARED = ("embed_tokens.", "lm_head.")  # read from the target, never trained or shipped


@dataclasses.dataclass(frozen=True)
class DraftLayout:
    target_path: str
    layers: list[int]  # target layers the draft's decoder layers are initialised from, in order
    head_vocab: list[int]  # token ids the head covers, most frequent first
    feature_layers: list[int] = dataclasses.field(default_factory=list)  # target taps (EAGLE-3); [] = final hidden

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DraftLayout":
        return cls(**json.loads(text))


def eagle3_taps(num_layers: int) -> list[int]:
    """A low, a middle and a high layer of the target, as EAGLE-3 picks them."""
    return [2, num_layers // 2, num_layers - 3]


class FusedInputLayer(DecoderLayer):
    """EAGLE-3's decoder layer: attention reads [norm(embedding), norm(feature)], the feature is the
    residual stream."""

    def __init__(self, spec, base: DecoderLayer) -> None:
        super().__init__(spec, base.qkv_proj.bias is not None, base.o_proj.bias is not None,
                         base.down_proj.bias is not None)
        self.load_state_dict(base.state_dict(), strict=False)
        h = spec.hidden_size
        self.hidden_norm = RMSNorm(h, spec.rms_norm_eps)
        wide = Linear(2 * h, self.qkv_proj.out_features, bias=self.qkv_proj.bias is not None)
        with torch.no_grad():  # starts as the target's layer over the embedding; learns the feature's part
            wide.weight.zero_()
            wide.weight[:, :h].copy_(base.qkv_proj.weight)
            if wide.bias is not None:
                wide.bias.copy_(base.qkv_proj.bias)
        self.qkv_proj = wide

    def fused_inputs(self, emb: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(feature)], dim=-1)

    def attention(self, layer: int, emb, feature, cos, sin, attn: AttentionBackend) -> torch.Tensor:
        """The attention output [T, heads * dim], before the output projection."""
        q, k, v = self.qkv(self.fused_inputs(emb, feature), cos, sin)
        return attn.forward(layer, q, k, v).reshape(feature.shape[0], -1)

    def forward_fused(self, layer: int, emb, feature, cos, sin, attn: AttentionBackend) -> torch.Tensor:
        x = feature + self.o_proj(self.attention(layer, emb, feature, cos, sin, attn))
        return x + self.mlp(x)


class FeatureDraft(LlamaModel):
    takes_features = True

    def __init__(self, spec, hf_config, state_dict, max_len, head_vocab, feature_layers=()) -> None:
        super().__init__(spec, hf_config, state_dict, max_len, head_vocab)
        h = spec.hidden_size
        self.target_layers = tuple(feature_layers)  # what the target must return as features
        if self.target_layers:
            self.fc = Linear(h * len(self.target_layers), h, bias=False)
            self.layers = nn.ModuleList(FusedInputLayer(spec, layer) for layer in self.layers)
        else:
            self.fc = Linear(h, h)
            nn.init.zeros_(self.fc.weight)
            nn.init.zeros_(self.fc.bias)

    def fuse(self, features: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The target's taps go through the fusion; the draft's own output states are already h wide."""
        features = features.to(dtype)
        return self.fc(features) if features.shape[-1] != self.spec.hidden_size else features

    def embed(self, input_ids: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        tokens = self.embed_tokens(input_ids)
        return tokens + self.fc(features.to(tokens.dtype))

    def run(self, input_ids, positions, attn: AttentionBackend, features=None):
        if not self.target_layers:
            return super().run(input_ids, positions, attn, features)
        emb = self.embed_tokens(input_ids)
        x = self.fuse(features, emb.dtype)
        cos, sin = self.rope(positions, emb.dtype)
        if self.layer_ops is not None and (stack := fused_stack(self)) is not None:
            return self._run_fused(stack, emb, x, cos, sin, attn)
        for i, layer in enumerate(self.layers):
            x = layer.forward_fused(i, emb, x, cos, sin, attn)
        return self.norm(x), x

    def _run_fused(self, stack, emb, x, cos, sin, attn: AttentionBackend):
        """run's layers with everything after attention in one C++ call per layer (fused_layer.py):
        the Python path's ~14 ATen calls cost more than the arithmetic of a draft step."""
        eps, residual, mlp = self.spec.rms_norm_eps, x, None
        for i, layer in enumerate(self.layers):
            residual = residual.clone() if mlp is None else residual + mlp  # a fresh stream: the ops update it in place
            out = layer.attention(i, emb, residual, cos, sin, attn).contiguous()
            mlp = self.layer_ops.post_attention(out, residual, *stack.post[i], eps)
        hidden = self.layer_ops.add_rms_norm(mlp, residual, self.norm.weight, eps)
        return hidden, residual


def base_draft(layout: DraftLayout, max_len: int, parts=None) -> FeatureDraft:
    """The untrained draft: the layout's target layers, the target's final norm, a head over
    `head_vocab` made of the target's output rows, an untrained fusion."""
    hf_config, spec, sd = parts or read_checkpoint(layout.target_path)
    renamed = {k: v for k, v in sd.items() if not k.startswith("model.layers.")}
    for j, i in enumerate(layout.layers):
        prefix = f"model.layers.{i}."
        renamed.update({f"model.layers.{j}." + k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    draft_spec = dataclasses.replace(spec, num_layers=len(layout.layers))
    return FeatureDraft(draft_spec, hf_config, renamed, max_len=max_len, head_vocab=layout.head_vocab,
                        feature_layers=layout.feature_layers)


def trainable(model: FeatureDraft) -> list[nn.Parameter]:
    """Everything but the shared embeddings and head rows; freezes those."""
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith(SHARED))
        if p.requires_grad:
            params.append(p)
    return params


def save_draft(model: FeatureDraft, layout: DraftLayout, path: str) -> None:
    """Writes the draft's own tensors: matrices in bfloat16, norms and biases in float32."""
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    own = {k: v.detach().float() for k, v in model.state_dict().items() if not k.startswith(SHARED)}
    tensors = {k: (v.to(torch.bfloat16) if v.dim() == 2 else v).contiguous() for k, v in own.items()}
    save_file(tensors, path, metadata={"layout": layout.to_json()})


def trained_draft(path: str, max_len: int, target_parts=None,
                  head_rows: int | None = None) -> tuple[FeatureDraft, DraftLayout]:
    """A draft saved by save_draft, around the target's shared tensors (float32, trainable as loaded):
    what serving places on its device and what training warm-starts from. `head_rows` keeps the head's
    first rows only (ModelConfig.head_rows); the head is shared, so the saved tensors fit either way."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if path == EMBEDDED_DRAFT:
        path = SHIPPED
    if not os.path.isfile(path):
        raise FileNotFoundError(f"draft weights not found: {path} (train them: python -m tools.draft.train)")
    with safe_open(path, "pt") as f:
        layout = DraftLayout.from_json(f.metadata()["layout"])
    if head_rows is not None:
        if head_rows > len(layout.head_vocab):
            raise ValueError(f"head_rows {head_rows} exceeds the {len(layout.head_vocab)} rows of {path}'s head")
        layout = dataclasses.replace(layout, head_vocab=layout.head_vocab[:head_rows])
    model = base_draft(layout, max_len, target_parts)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in load_file(path).items()}, strict=False)
    if unexpected or any(not k.startswith(SHARED) for k in missing):
        raise ValueError(f"{path} does not match its layout: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model, layout


def load_draft(path: str, config: ModelConfig, target_parts=None) -> FeatureDraft:
    """Rebuild a shipped draft around the target's shared tensors, on config's device and dtype."""
    model, _ = trained_draft(path, config.max_model_len, target_parts, config.head_rows)
    model.requires_grad_(False)
    return model.place(config.device, TORCH_DTYPES[config.dtype]).eval()
