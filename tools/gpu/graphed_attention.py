"""FlashInfer attention for a CUDA graph: one wrapper in graph mode for one batch, its index arrays, mask and
their offsets in fixed buffers made here, planned outside the graph.

The wrappers and their plans are the engine's own (FlashInferBackend's graph helpers, used by
adaserve_backend/cuda_graphs/decode.py and tree.py, whose docstrings hold flashinfer 0.6.18's graph-mode
contracts): a batch of one token per request on chains (a width-1 beam step) goes to the decode wrapper,
with no mask; a tree batch (width > 1) to the prefill wrapper, always masked, planned with the boolean
mask it packs itself. The inputs come from `build_plan`; our own packing sizes the mask buffer: the bytes
plan's packing makes, as a GPU test holds it to."""

from __future__ import annotations

import torch

from adaserve_backend.attention import flashinfer_cuda
from adaserve_backend.attention.flashinfer_plan import FlashInferPlan, build_plan
from adaserve_backend.attention.metadata import AttentionMetadata
from adaserve_backend.kv_cache import KVCache


class GraphedAttention:
    """Layer 0 of `cache` through a graph-mode wrapper for the batch `meta` describes. `attend(q, k, v)`
    writes k and v at the batch's slots and runs the wrapper into a fixed output: nothing it launches
    depends on the host, so it can be captured."""

    def __init__(self, cache: KVCache, meta: AttentionMetadata, num_heads: int, causal: bool | None = None):
        data = cache.data
        self.backend = flashinfer_cuda.FlashInferBackend(cache, num_heads)
        self.cache, self.meta = cache, meta
        if causal is None:
            causal = flashinfer_cuda.batch_is_causal(meta)
        self.plan_inputs: FlashInferPlan = build_plan(meta, causal=causal)
        p, device, b = self.plan_inputs, data.device, len(meta.q_lens)
        i32 = dict(dtype=torch.int32, device=device)
        kv_indptr = torch.zeros(b + 1, **i32)
        indices = torch.zeros(max(p.paged_kv_indices.numel(), 1), **i32)
        last = torch.zeros(b, **i32)
        if p.decode_only:
            self.kernel = "decode"
            self.wrapper = self.backend.graph_decode_wrapper(kv_indptr, indices, last)
        elif p.causal:
            raise ValueError("a causal batch of several tokens per request has no graph-mode wrapper here: "
                             "beam steps of width > 1 are masked, width 1 is decode")
        else:
            self.kernel = "prefill masked"
            mask = torch.zeros(max(p.packed_custom_mask.numel(), 1), dtype=torch.uint8, device=device)
            self.wrapper = self.backend.graph_prefill_wrapper(torch.zeros(b + 1, **i32), kv_indptr, indices, last,
                                                              mask, torch.zeros(b + 1, **i32))
        self.layer = cache.layer(0)
        self.out = torch.empty(p.num_tokens, num_heads, data.shape[-1], dtype=data.dtype, device=device)
        self.plan()

    def plan(self) -> None:
        """Host work (outside any graph): the batch's page tables and mask into the wrapper's buffers."""
        p = self.plan_inputs
        qo_indptr, kv_indptr, last = flashinfer_cuda.host_index(p.q_lens, p.kv_lens, p.page_size)
        if self.kernel == "decode":
            self.backend.plan_graph_decode(self.wrapper, kv_indptr, p.paged_kv_indices, last)
        else:
            self.backend.plan_graph_prefill(self.wrapper, qo_indptr, kv_indptr, p.paged_kv_indices, last,
                                            p.custom_mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.write(0, self.meta.slot_mapping, k, v)
        if q.stride(-1) != 1:
            q = q.contiguous()
        return self.wrapper.run(q, self.layer, out=self.out)
