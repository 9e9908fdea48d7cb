"""Dense causal attention without a KV cache, for teacher-forced passes (training the draft, computing
teacher logits): B right-padded sequences of length T, flattened to [B*T] tokens as the model expects.
Right padding never leaks into real positions under a causal mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseCausalBackend:
    cuda_graphs = False

    def __init__(self, batch: int, seq_len: int) -> None:
        self.batch, self.seq_len = batch, seq_len

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t = self.batch, self.seq_len
        shape = lambda x: x.view(b, t, x.shape[1], x.shape[2]).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(shape(q), shape(k), shape(v), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(b * t, q.shape[1], q.shape[2])

    def positions(self, device) -> torch.Tensor:
        return torch.arange(self.seq_len, device=device).repeat(self.batch)
