"""The KV cache tensors: one [layers, 2, blocks, block_size, kv_heads, head_dim] buffer.

Per layer, `k` and `v` are contiguous [blocks, block_size, kv_heads, head_dim] views: the NHD paged
layout FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` takes as a (k_cache, v_cache) tuple.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> int:
    return num_layers * 2 * block_size * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.block_size = block_size
        self.data = torch.zeros(
            (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, device=device
        )
        # Flat views [layers, 2, slots, heads, dim] share storage with `data`.
        self._flat = self.data.view(num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim)
        # made once: indexing per call is paid per layer and forward, in both models, every iteration
        # (evidence: docs/architecture.md#the-model-runtime)
        self._layer_views = [(self._flat[i, 0], self._flat[i, 1]) for i in range(num_layers)]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index, 0], self.data[index, 1]

    def layer_flat(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[slots, kv_heads, head_dim] views of one layer's keys and values."""
        return self._layer_views[index]

    def write(self, index: int, slots: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys and values [T, kv_heads, head_dim] at `slots` of one layer; returns its flat views."""
        k_flat, v_flat = self.layer_flat(index)
        k_flat.index_copy_(0, slots, k)
        v_flat.index_copy_(0, slots, v)
        return k_flat, v_flat

    def move(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy the KV entries of slots `src` to slots `dst` in every layer (gather first, so order
        within the call does not matter)."""
        if not src:
            return
        device = self.data.device
        src_t = torch.tensor(src, dtype=torch.long, device=device)
        dst_t = torch.tensor(dst, dtype=torch.long, device=device)
        self._flat[:, :, dst_t] = self._flat[:, :, src_t]
