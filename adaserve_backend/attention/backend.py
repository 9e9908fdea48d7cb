"""The attention-backend interface: planned once per forward, then called once per layer."""

from __future__ import annotations

from typing import Protocol

import torch

from ..kv_cache.kv_cache import KVCache
from .metadata import AttentionMetadata


class AttentionBackend(Protocol):
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare index/mask structures for this forward (outside any per-layer loop)."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v [T, kv_heads, D] into the cache, attend q [T, heads, D]; returns [T, heads, D]."""


def make_backend(name: str, kv_cache: KVCache, num_heads: int) -> AttentionBackend:
    """num_heads: query heads (the cache holds the KV heads)."""
    if name == "torch":
        from .torch_sdpa import TorchSDPABackend

        return TorchSDPABackend(kv_cache, num_heads)
    raise ValueError(f"unknown attention backend {name!r} (available: torch)")
