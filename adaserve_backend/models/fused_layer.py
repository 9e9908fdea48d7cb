"""The decoder stack of a CPU bfloat16 target through csrc/decoder_layer.cpp: two C++ calls per layer
around attention instead of ~35 small ATen calls (see the kernel's header for why).

Used where it applies (bfloat16 on CPU, SiLU MLP, every projection prepacked, inference); everywhere
else, and for float32 (the exact oracle), the Python layers in llama.py run. Both paths round every
intermediate to bfloat16 at the same points.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.backend import AttentionBackend
from . import linear


def projections(model):
    """Every projection the fused ops read prepacked."""
    return [m for layer in model.layers for m in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]


def decoder_layer_ops(model):
    """The compiled ops if `model` (a LlamaModel, placed) can use them, else None."""
    applies = (
        model.spec.hidden_act == "silu"
        and model.norm.weight.device.type == "cpu"
        and model.norm.weight.dtype == torch.bfloat16
        and all(m._packed is not None for m in projections(model))
    )
    return linear.kernels() if applies else None


@dataclass(frozen=True)
class FusedStack:
    """What the fused ops read of each layer, gathered once: looked up per forward through nn.Module
    attributes, the ~14 tensors of every layer and the currency check over every projection are Python
    paid on each target forward, a noticeable share of a small model's decode step (evidence:
    docs/architecture.md#the-model-runtime)."""

    pre: list[tuple]  # per layer: input norm weight, qkv (packed, pairs, q4, bias)
    # per layer: o_proj (packed, pairs, q4, bias), post-attention norm weight, gate_up (...), down (...)
    post: list[tuple]
    packed_versions: list[tuple[torch.Tensor, int]]  # each projection's weight and the version that was packed
    generation: int  # linear.pack_generation when gathered


def fused_stack(model) -> FusedStack | None:
    """The model's gathered layer tensors for inference on the weights that were packed; None where the
    Python path must run (grad enabled, or a weight changed since it was packed: training)."""
    if torch.is_grad_enabled():
        return None
    stack = model.__dict__.get("_fused_stack")
    if stack is None or stack.generation != linear.pack_generation:
        def w(m):
            return m._packed, m._pairs, m._blocks, m.bias

        stack = FusedStack(
            [(layer.input_layernorm.weight, *w(layer.qkv_proj)) for layer in model.layers],
            [(*w(layer.o_proj), layer.post_attention_layernorm.weight, *w(layer.gate_up_proj), *w(layer.down_proj))
             for layer in model.layers],
            [(m.weight, m._packed_version) for m in projections(model)],
            linear.pack_generation,
        )
        model.__dict__["_fused_stack"] = stack
    return stack if all(w._version == v for w, v in stack.packed_versions) else None


def run_layers(model, ops, stack: FusedStack, x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, attn: AttentionBackend):
    """What LlamaModel.run returns, through the fused ops. x: the embeddings [T, hidden] (a fresh tensor:
    it becomes the residual stream, updated in place); cos, sin: [T, 1, head_dim]."""
    s, tokens = model.spec, x.shape[0]
    cos, sin = cos.reshape(tokens, -1).contiguous(), sin.reshape(tokens, -1).contiguous()
    split, eps, taps_at = [s.num_heads, s.num_kv_heads, s.num_kv_heads], s.rms_norm_eps, model.feature_layers
    heads, head_dim = s.num_heads + s.num_kv_heads, s.head_dim
    residual, mlp, taps = x.contiguous(), None, []
    for i, (pre, post) in enumerate(zip(stack.pre, stack.post)):
        qkv = ops.pre_attention(mlp, residual, *pre, cos, sin, heads, head_dim, eps)
        if i in taps_at:
            taps.append(residual.clone())  # the stream entering layer i; residual changes in place
        q, k, v = qkv.view(tokens, -1, head_dim).split(split, dim=1)
        mlp = ops.post_attention(attn.forward(i, q, k, v).reshape(tokens, -1).contiguous(), residual, *post, eps)
    hidden = ops.add_rms_norm(mlp, residual, model.norm.weight, eps)
    return hidden, (torch.cat(taps, dim=-1) if taps else hidden)
