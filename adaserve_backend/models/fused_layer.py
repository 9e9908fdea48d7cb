"""The decoder stack of a CPU bfloat16 target through csrc/decoder_layer.cpp: two C++ calls per layer
around attention instead of ~35 small ATen calls (see the kernel's header for why).

Used where it applies (bfloat16 on CPU, SiLU MLP, every projection prepacked, inference); everywhere
else, and for float32 (the exact oracle), the Python layers in llama.py run. Both paths round every
intermediate to bfloat16 at the same points.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..attention.backend import AttentionBackend
from ..cpu_extension import load_extension

SOURCE = Path(__file__).parent / "csrc" / "decoder_layer.cpp"


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
    return load_extension("adaserve_decoder_layer", SOURCE) if applies else None


def packs_current(model) -> bool:
    """Inference on the weights that were packed: a model trained after packing must take the Python
    path (models/linear.py makes the same check per projection)."""
    return not torch.is_grad_enabled() and all(m._packed_version == m.weight._version for m in projections(model))


def run_layers(model, ops, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend):
    """What LlamaModel.run returns, through the fused ops. x: the embeddings [T, hidden] (a fresh tensor:
    it becomes the residual stream, updated in place); cos, sin: [T, 1, head_dim]."""
    s, tokens = model.spec, x.shape[0]
    cos, sin = cos.reshape(tokens, -1).contiguous(), sin.reshape(tokens, -1).contiguous()
    split = [s.num_heads, s.num_kv_heads, s.num_kv_heads]
    residual, mlp, taps = x.contiguous(), None, []
    for i, layer in enumerate(model.layers):
        qkv = ops.pre_attention(mlp, residual, layer.input_layernorm.weight, layer.qkv_proj._packed, layer.qkv_proj.bias,
                                cos, sin, s.num_heads + s.num_kv_heads, s.head_dim, s.rms_norm_eps)
        if i in model.feature_layers:
            taps.append(residual.clone())  # the stream entering layer i; residual changes in place
        q, k, v = qkv.view(tokens, -1, s.head_dim).split(split, dim=1)
        out = attn.forward(i, q, k, v).reshape(tokens, -1).contiguous()
        mlp = ops.post_attention(out, residual, layer.o_proj._packed, layer.o_proj.bias, layer.post_attention_layernorm.weight,
                                 layer.gate_up_proj._packed, layer.gate_up_proj.bias, layer.down_proj._packed,
                                 layer.down_proj.bias, s.rms_norm_eps)
    hidden = ops.add_rms_norm(mlp, residual, model.norm.weight, s.rms_norm_eps)
    return hidden, (torch.cat(taps, dim=-1) if taps else hidden)
