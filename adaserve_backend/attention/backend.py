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


BACKENDS = ("auto", "torch", "paged_cpu")


def make_backend(name: str, kv_cache: KVCache, num_heads: int) -> AttentionBackend:
    """num_heads: query heads (the cache holds the KV heads). auto: paged_cpu for a bfloat16 cache on
    CPU when its kernel builds, torch otherwise (float32, the exact oracle, always runs torch's SDPA)."""
    from .torch_sdpa import TorchSDPABackend

    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})")
    cache = kv_cache.data
    if name == "paged_cpu" or (name == "auto" and cache.device.type == "cpu" and cache.dtype == torch.bfloat16):
        from .cpu_kernel import paged_attention_op
        from .paged_cpu import PagedCPUBackend

        op = paged_attention_op()
        if op is not None:
            return PagedCPUBackend(kv_cache, num_heads, op)
        if name == "paged_cpu":
            raise RuntimeError("attention backend paged_cpu: its C++ kernel could not be built (see the log)")
    return TorchSDPABackend(kv_cache, num_heads)
