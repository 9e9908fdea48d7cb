"""CPU attention that reads the paged cache in place (the C++ kernel of csrc/paged_attention.cpp).

torch's SDPA needs each sequence's keys and values contiguous, so the torch backend gathers them into
padded copies every layer, a copy of the whole context that under load costs about as much as the
attention itself (evidence: docs/architecture.md#the-model-runtime). The kernel walks the pages instead, for
every kind of sequence: decode steps, token trees and prefill chunks. Its bfloat16 loops keep their
accumulators in registers (bf16_tiles.h); without that, trees were slower through the kernel than
through SDPA (evidence: docs/architecture.md#the-model-runtime).
"""

from __future__ import annotations

import math

import torch

from ..kv_cache.kv_cache import KVCache
from .metadata import AttentionMetadata


class PagedCPUBackend:
    cuda_graphs = False

    def __init__(self, kv_cache: KVCache, num_heads: int, op) -> None:
        self.op = op
        self.cache = kv_cache
        self.scale = 1.0 / math.sqrt(kv_cache.data.shape[-1])
        self.meta: AttentionMetadata | None = None
        self.args: tuple = ()  # the kernel's per-forward arguments

    def plan(self, meta: AttentionMetadata) -> None:
        i64 = dict(dtype=torch.long, device=meta.kv_indices.device)
        tails = [m[:, p:].reshape(-1) for m, p in zip(meta.masks, meta.prefix_lens)]  # what the uncommitted tokens see
        q_starts, mask_starts = [0], [0]
        for n, tail in zip(meta.q_lens, tails):
            q_starts.append(q_starts[-1] + n)
            mask_starts.append(mask_starts[-1] + tail.numel())
        self.meta = meta
        self.args = (
            torch.tensor(q_starts[:-1], **i64),
            torch.tensor(meta.q_lens, **i64),
            meta.kv_indptr[:-1].to(torch.long),
            meta.kv_indices,
            torch.tensor(meta.kv_lens, **i64),
            torch.tensor(meta.prefix_lens, **i64),
            torch.tensor(mask_starts[:-1], **i64),
            torch.cat(tails),
            self.cache.block_size,
            self.scale,
        )

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.meta is not None, "plan() must run before forward()"
        k_flat, v_flat = self.cache.write(layer, self.meta.slot_mapping, k, v)
        out = torch.empty_like(q)
        self.op(out, q.contiguous(), k_flat, v_flat, *self.args)
        return out
