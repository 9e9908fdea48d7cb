"""CPU attention that reads the paged cache in place for sequences with few new tokens.

Under load a CPU forward is mostly decode steps over long contexts. The torch backend gathers every
sequence's keys and values into padded copies before SDPA, and on this machine that gather costs as
much as the attention (10 decode sequences, contexts 150-510, bf16: 7.6 ms of gathers and 7.7 ms of
SDPA per forward, one run). The kernel in csrc/paged_attention.cpp walks the pages instead.
Sequences with more new tokens than SMALL_QUERIES keep torch's SDPA, whose blocked kernels do more
arithmetic per byte than this kernel's loops: in one run (bf16, 10 sequences, contexts 150-510, whole
forward) the kernel took a decode batch from 46.7 to 39.2 ms, a decode batch beside a 33-token chunk
from 63.4 to 56.4, ten 2-token trees from 52.1 to 48.3, but ten 4-token trees from 60.3 to 64.2 and
ten 8-token trees from 74.0 to 90.0 ms.
"""

from __future__ import annotations

import math

import torch

from ..kv_cache.kv_cache import KVCache
from .metadata import AttentionMetadata
from .torch_sdpa import TorchSDPABackend

SMALL_QUERIES = 2


class PagedCPUBackend:
    def __init__(self, kv_cache: KVCache, num_heads: int, op) -> None:
        self.op = op
        self.sdpa = TorchSDPABackend(kv_cache, num_heads)
        self.page = kv_cache.block_size
        self.scale = 1.0 / math.sqrt(kv_cache.data.shape[-1])
        self.args: tuple | None = None  # the kernel's per-forward arguments, None: no small sequence

    def plan(self, meta: AttentionMetadata) -> None:
        small = [i for i, n in enumerate(meta.q_lens) if n <= SMALL_QUERIES]
        self.sdpa.plan(meta, [i for i, n in enumerate(meta.q_lens) if n > SMALL_QUERIES])
        self.args = self._kernel_args(meta, small) if small else None

    def _kernel_args(self, meta: AttentionMetadata, small: list[int]) -> tuple:
        device = meta.kv_indices.device
        members = set(small)
        starts, tails, mask_starts, offset, mask_start = [], [], [], 0, 0
        for i, n in enumerate(meta.q_lens):
            if i in members:
                starts.append(offset)
                tails.append(meta.masks[i][:, meta.prefix_lens[i] :].reshape(-1))
                mask_starts.append(mask_start)
                mask_start += tails[-1].numel()
            offset += n
        i64 = dict(dtype=torch.long, device=device)
        indptr = meta.kv_indptr.tolist()
        return (
            torch.tensor(starts, **i64),
            torch.tensor([meta.q_lens[i] for i in small], **i64),
            torch.tensor([indptr[i] for i in small], **i64),
            meta.kv_indices,
            torch.tensor([meta.kv_lens[i] for i in small], **i64),
            torch.tensor([meta.prefix_lens[i] for i in small], **i64),
            torch.tensor(mask_starts, **i64),
            torch.cat(tails),
            self.page,
            self.scale,
        )

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.args is None:
            return self.sdpa.forward(layer, q, k, v)
        k_flat, v_flat = self.sdpa.write(layer, k, v)
        out = torch.empty_like(q)
        self.op(out, q.contiguous(), k_flat, v_flat, *self.args)
        return self.sdpa.attend_into(out, q, k_flat, v_flat)

