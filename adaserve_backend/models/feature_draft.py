"""The project's draft: a feature-conditioned draft (EAGLE-style) made from the target itself.

Each draft token i reads two things: its token's embedding (the target's, shared) and the target's
final hidden state at position i-1, the feature from which the target predicted token i. A linear map
of the feature is added to the embedding, one decoder layer (initialised from the target's first)
mixes them with the draft's own KV cache, and the final norm's output is the draft's prediction of
the target's feature at i. The target's output head, restricted to the most frequent tokens, turns it
into the next-token distribution. Deeper tree levels feed a node's predicted feature to its children
(speculation/beam.py). The feature map starts at zero, so training starts from a working one-layer
language model (the target's first layer under its own norm and head) and learns to use the features.

A draft that sees what the target computed agrees with it far more often than a shallow copy of the
target that sees only tokens, at the cost of one decoder layer per step.

Only what training changes is shipped (fusion layer, decoder layer, norms, the head's token list);
embeddings and head rows are read from the target checkpoint at load time, so the file stays small.
Verification stays exact over the full vocabulary: the draft merely never proposes a rare token.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from torch import nn

from ..config import EMBEDDED_DRAFT, ModelConfig
from .linear import Linear
from .llama import LlamaModel
from .loader import TORCH_DTYPES, read_checkpoint

SHIPPED = os.path.join(os.path.dirname(__file__), "weights", "smollm2-135m-instruct-draft.safetensors")
SHARED = ("embed_tokens.", "lm_head.")  # read from the target, never trained or shipped


@dataclasses.dataclass(frozen=True)
class DraftLayout:
    target_path: str
    layers: list[int]  # target layers the draft's decoder layers are initialised from, in order
    head_vocab: list[int]  # token ids the head covers, most frequent first

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DraftLayout":
        return cls(**json.loads(text))


class FeatureDraft(LlamaModel):
    takes_features = True

    def __init__(self, spec, hf_config, state_dict, max_len, head_vocab) -> None:
        super().__init__(spec, hf_config, state_dict, max_len, head_vocab)
        self.fc = Linear(spec.hidden_size, spec.hidden_size)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def embed(self, input_ids: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        tokens = self.embed_tokens(input_ids)
        return tokens + self.fc(features.to(tokens.dtype))


def base_draft(layout: DraftLayout, max_len: int, parts=None) -> FeatureDraft:
    """The untrained draft: the layout's target layers, the target's final norm, a head over
    `head_vocab` made of the target's output rows, a zero feature map."""
    hf_config, spec, sd = parts or read_checkpoint(layout.target_path)
    renamed = {k: v for k, v in sd.items() if not k.startswith("model.layers.")}
    for j, i in enumerate(layout.layers):
        prefix = f"model.layers.{i}."
        renamed.update({f"model.layers.{j}." + k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    draft_spec = dataclasses.replace(spec, num_layers=len(layout.layers))
    return FeatureDraft(draft_spec, hf_config, renamed, max_len=max_len, head_vocab=layout.head_vocab)


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


def load_draft(path: str, config: ModelConfig, target_parts=None) -> FeatureDraft:
    """Rebuild a shipped draft around the target's shared tensors, on config's device and dtype."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if path == EMBEDDED_DRAFT:
        path = SHIPPED
    if not os.path.isfile(path):
        raise FileNotFoundError(f"draft weights not found: {path} (train them: python -m tools.draft.train)")
    with safe_open(path, "pt") as f:
        layout = DraftLayout.from_json(f.metadata()["layout"])
    model = base_draft(layout, config.max_model_len, target_parts)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in load_file(path).items()}, strict=False)
    if unexpected or any(not k.startswith(SHARED) for k in missing):
        raise ValueError(f"{path} does not match its layout: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.requires_grad_(False)
    return model.place(config.device, TORCH_DTYPES[config.dtype]).eval()
