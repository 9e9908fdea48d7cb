"""A stack of Llama decoder layers at Llama-3.1-8B's shape with random weights, for timing a forward where
no checkpoint can be carried (the GPU machine reaches nothing, and one transfer holds 64 MiB): the matrix
shapes are the real model's, so the times stand for its, though the outputs mean nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tools.gpu.points import SHAPE


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class RandomDecoderStack:
    """`layers` Llama decoder layers (fused QKV and gate/up projections, RoPE, SwiGLU) with random weights,
    and the output head; attention through a planned backend over a KV cache of as many layers."""

    def __init__(self, layers: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0, max_pos: int = 8192,
                 device="cuda") -> None:
        s = SHAPE
        self.layers, self.dtype, self.device = layers, dtype, device
        gen = torch.Generator(device=device).manual_seed(seed)

        def w(*shape):
            return (torch.randn(*shape, generator=gen, dtype=dtype, device=device) * 0.02)

        hidden, inter, D = s["hidden"], s["intermediate"], s["head_dim"]
        q, kv = s["heads"] * D, s["kv_heads"] * D
        self.weights = [dict(ln1=torch.ones(hidden, dtype=dtype, device=device), qkv=w(q + 2 * kv, hidden),
                             o=w(hidden, q), ln2=torch.ones(hidden, dtype=dtype, device=device),
                             gate_up=w(2 * inter, hidden), down=w(hidden, inter))
                        for _ in range(layers)]
        self.norm = torch.ones(hidden, dtype=dtype, device=device)
        self.lm_head = w(s["vocab"], hidden)
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
        freqs = torch.arange(max_pos, dtype=torch.float32, device=device)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    @property
    def layer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights[0].values())

    @property
    def layer_params(self) -> int:
        return sum(t.numel() for t in self.weights[0].values())

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        s = SHAPE
        heads, kv_heads, D = s["heads"], s["kv_heads"], s["head_dim"]
        cos = self.cos.index_select(0, positions).to(self.dtype)[:, None, :]
        sin = self.sin.index_select(0, positions).to(self.dtype)[:, None, :]
        for i, w in enumerate(self.weights):
            qk, v = F.linear(rms_norm(x, w["ln1"]), w["qkv"]).split([(heads + kv_heads) * D, kv_heads * D], dim=-1)
            qk = rotate(qk.view(-1, heads + kv_heads, D), cos, sin)
            q, k = qk.split([heads, kv_heads], dim=1)
            a = attn.forward(i, q, k, v.view(-1, kv_heads, D))
            x = x + F.linear(a.reshape(x.shape[0], -1), w["o"])
            gate, up = F.linear(rms_norm(x, w["ln2"]), w["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        return x

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(rows, self.norm), self.lm_head)
