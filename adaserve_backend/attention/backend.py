"""The attention-backend interface: planned once per forward, then called once per layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..kv_cache.kv_cache import KVCache
from .metadata import AttentionMetadata


class AttentionBackend(Protocol):
    # Whether a forward can be captured and replayed as a CUDA graph (cuda_graphs/): the backend then
    # also offers graph-mode wrappers that plan into fixed buffers (graph_decode_wrapper,
    # graph_prefill_wrapper, as flashinfer_cuda.py does). The model runner keys its graphs on this alone.
    cuda_graphs: bool

    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare index/mask structures for this forward (outside any per-layer loop)."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v [T, kv_heads, D] into the cache, attend q [T, heads, D]; returns [T, heads, D]."""


BACKENDS = ("auto", "torch", "paged_cpu", "flashinfer")


def choose_backend(name: str, device_type: str, dtype: torch.dtype,
                   flashinfer_importable: Callable[[], bool]) -> str:
    """What `name` means for a cache of `dtype` on `device_type`. auto: paged_cpu for a bfloat16 cache on
    CPU (make_backend falls back to torch when its kernel does not build), flashinfer for a bfloat16 or
    float16 cache on CUDA when flashinfer imports, torch otherwise (float32, the exact oracle, always runs
    torch's SDPA)."""
    if name != "auto":
        return name
    if device_type == "cpu" and dtype == torch.bfloat16:
        return "paged_cpu"
    if device_type == "cuda" and dtype in (torch.bfloat16, torch.float16) and flashinfer_importable():
        return "flashinfer"
    return "torch"


def make_backend(name: str, kv_cache: KVCache, num_heads: int) -> AttentionBackend:
    """num_heads: query heads (the cache holds the KV heads); name: one of BACKENDS (see choose_backend)."""
    from .torch_sdpa import TorchSDPABackend

    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} (available: {', '.join(BACKENDS)})")
    from .flashinfer_cuda import flashinfer_importable  # imports no flashinfer until asked

    cache = kv_cache.data
    chosen = choose_backend(name, cache.device.type, cache.dtype, flashinfer_importable)
    if chosen == "flashinfer":
        from .flashinfer_cuda import FlashInferBackend

        return FlashInferBackend(kv_cache, num_heads)
    if chosen == "paged_cpu":
        if cache.device.type != "cpu":
            raise ValueError(f"attention backend paged_cpu runs a CPU kernel; the cache is on {cache.device}")
        from .cpu_kernel import paged_attention_op
        from .paged_cpu import PagedCPUBackend

        op = paged_attention_op()
        if op is not None:
            return PagedCPUBackend(kv_cache, num_heads, op)
        if name == "paged_cpu":
            raise RuntimeError("attention backend paged_cpu: its C++ kernel could not be built (see the log)")
    return TorchSDPABackend(kv_cache, num_heads)
