"""Attention with torch's scaled_dot_product_attention and explicit masks (CPU and CUDA).

Sequences are padded into one [B, heads, max_q, max_kv] problem: one gather of K/V and one SDPA call
per layer for the whole batch, instead of a Python loop over sequences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kv_cache.kv_cache import KVCache
from .metadata import AttentionMetadata


class TorchSDPABackend:
    def __init__(self, kv_cache: KVCache) -> None:
        self.cache = kv_cache
        self.meta: AttentionMetadata | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        device = self.cache.data.device
        page = meta.page_size
        b, max_q, max_kv = len(meta.q_lens), max(meta.q_lens), max(meta.kv_lens)
        gather = torch.zeros(b, max_kv, dtype=torch.long, device=device)
        mask = torch.zeros(b, 1, max_q, max_kv, dtype=torch.bool, device=device)
        # Padded query rows must see at least one key, or SDPA returns NaN for them.
        mask[:, :, :, 0] = True
        offsets = torch.arange(max_kv, device=device)
        rows = []
        indptr = meta.kv_indptr.tolist()
        for i, (q_len, kv_len) in enumerate(zip(meta.q_lens, meta.kv_lens)):
            blocks = meta.kv_indices[indptr[i] : indptr[i + 1]].to(torch.long)
            pos = offsets[:kv_len]
            gather[i, :kv_len] = blocks[pos // page] * page + pos % page
            mask[i, 0, :q_len, :kv_len] = meta.masks[i]
            rows.append(torch.arange(q_len, device=device) + i * max_q)
        self.meta = meta
        self._gather = gather.view(-1)  # index_select on a flat index is several times faster than k[gather]
        # Hand SDPA the simplest problem that is equivalent, as transformers does: no mask when every
        # query sees every key (decode over equal lengths), is_causal for a fresh causal prefill. Its
        # kernels then round exactly as transformers' own calls do, and skip the mask reads.
        self._causal = b == 1 and max_q == max_kv and torch.equal(mask[0, 0], torch.ones_like(mask[0, 0]).tril_())
        self._mask = None if self._causal or bool(mask.all()) else mask
        # A decode batch (one token each) or a single sequence has no padded query rows to scatter
        # into and pick back out.
        self._q_rows = None if all(q == max_q for q in meta.q_lens) else torch.cat(rows)
        self._shape = (b, max_q, max_kv)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.meta is not None, "plan() must run before forward()"
        k_flat, v_flat = self.cache.layer_flat(layer)
        k_flat.index_copy_(0, self.meta.slot_mapping, k)
        v_flat.index_copy_(0, self.meta.slot_mapping, v)
        b, max_q, max_kv = self._shape
        heads, dim = q.shape[1], q.shape[2]
        if self._q_rows is not None:
            q = q.new_zeros(b * max_q, heads, dim).index_copy_(0, self._q_rows, q)
        q = q.view(b, max_q, heads, dim).transpose(1, 2)
        kv_heads = k_flat.shape[1]
        keys = k_flat.index_select(0, self._gather).view(b, max_kv, kv_heads, dim).transpose(1, 2)
        values = v_flat.index_select(0, self._gather).view(b, max_kv, kv_heads, dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=self._mask, is_causal=self._causal, enable_gqa=True)
        out = out.transpose(1, 2).reshape(b * max_q, heads, dim)
        return out if self._q_rows is None else out.index_select(0, self._q_rows)
