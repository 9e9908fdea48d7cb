"""FlashInfer attention for a CUDA graph: one wrapper in graph mode (`use_cuda_graph=True`) for one batch,
its index arrays, mask and their offsets in fixed buffers made here, planned outside the graph.

Why this shape (flashinfer 0.6.18, prefill.py / decode.py): in graph mode a wrapper's batch size is fixed
at construction (len(qo_indptr_buf) - 1, or len(paged_kv_last_page_len_buffer) for decode), plan() copies
the page tables, the packed mask and its byte offsets into the buffers, and run() reads only those and
the plan info, so a captured run reads whatever the latest plan wrote. The first plan fixes the most
query rows a later one may have. A prefill wrapper given a `custom_mask_buf` always runs masked, so a
chain batch (one token per request: a width-1 beam step) goes to the decode wrapper, with no mask.

The rest is FlashInferBackend's contract (adaserve_backend/attention/flashinfer_cuda.py): the inputs from
`build_plan`, host-side indptrs and last-page lengths, FA2 kernels, pos_encoding_mode "NONE" (q and k come
rotated), and the boolean `custom_mask` for plan() to pack, never `packed_custom_mask` (flashinfer PR
2201: plan would keep offsets counted in bits). Our own packing sizes the mask buffer: the bytes plan's
packing makes, as a GPU test holds it to."""

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
        flashinfer = flashinfer_cuda.import_flashinfer()
        data = cache.data
        self.cache, self.meta, self.num_heads = cache, meta, num_heads
        self.kv_heads, self.head_dim, self.dtype = data.shape[-2], data.shape[-1], data.dtype
        if causal is None:
            causal = flashinfer_cuda.batch_is_causal(meta)
        self.plan_inputs: FlashInferPlan = build_plan(meta, causal=causal)
        p, device, b = self.plan_inputs, data.device, len(meta.q_lens)
        i32 = dict(dtype=torch.int32, device=device)
        self.kv_indptr_buf = torch.zeros(b + 1, **i32)
        self.indices_buf = torch.zeros(max(p.paged_kv_indices.numel(), 1), **i32)
        self.last_page_len_buf = torch.zeros(b, **i32)
        ws = flashinfer_cuda.workspace(device)
        common = dict(kv_layout="NHD", use_cuda_graph=True, backend=flashinfer_cuda.KERNEL_BACKEND)
        if p.decode_only:
            self.kernel = "decode"
            self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws, use_tensor_cores=True, paged_kv_indptr_buffer=self.kv_indptr_buf,
                paged_kv_indices_buffer=self.indices_buf, paged_kv_last_page_len_buffer=self.last_page_len_buf,
                **common)
        else:
            self.kernel = "prefill causal" if p.causal else "prefill masked"
            self.qo_indptr_buf = torch.zeros(b + 1, **i32)
            self.mask_buf = self.mask_indptr_buf = None
            if not p.causal:
                self.mask_buf = torch.zeros(max(p.packed_custom_mask.numel(), 1), dtype=torch.uint8, device=device)
                self.mask_indptr_buf = torch.zeros(b + 1, **i32)
            self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                ws, qo_indptr_buf=self.qo_indptr_buf, paged_kv_indptr_buf=self.kv_indptr_buf,
                paged_kv_indices_buf=self.indices_buf, paged_kv_last_page_len_buf=self.last_page_len_buf,
                custom_mask_buf=self.mask_buf, mask_indptr_buf=self.mask_indptr_buf, **common)
        self.layer = cache.layer(0)
        self.out = torch.empty(p.num_tokens, num_heads, self.head_dim, dtype=self.dtype, device=device)
        self.plan()

    def plan(self) -> None:
        """Host work (outside any graph): the batch's page tables and mask into the wrapper's buffers."""
        p = self.plan_inputs
        qo_indptr, kv_indptr, last = flashinfer_cuda.host_index(p.q_lens, p.kv_lens, p.page_size)
        common = dict(pos_encoding_mode="NONE", q_data_type=self.dtype, kv_data_type=self.dtype)
        args = (self.num_heads, self.kv_heads, self.head_dim, p.page_size)
        if self.kernel == "decode":
            self.wrapper.plan(kv_indptr, p.paged_kv_indices, last, *args, **common)
        else:
            self.wrapper.plan(qo_indptr, kv_indptr, p.paged_kv_indices, last, *args, custom_mask=p.custom_mask,
                              causal=p.causal, **common)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.write(0, self.meta.slot_mapping, k, v)
        if q.stride(-1) != 1:
            q = q.contiguous()
        return self.wrapper.run(q, self.layer, out=self.out)
