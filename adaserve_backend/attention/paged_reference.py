"""What FlashInfer's batch prefill over paged KV must compute, in plain torch, from its plan inputs only.

The CPU stand-in for `BatchPrefillWithPagedKVCacheWrapper.run`: it reads nothing but a `FlashInferPlan`
(indptrs, page indices, last-page lengths, the packed mask bytes and their byte offsets, unpacking the
bits itself as the kernel does) and the NHD (k_cache, v_cache) pair the kernel is handed. So when it
agrees with our torch backend, which works from AttentionMetadata instead, the plan encodes the same
attention; a GPU test then holds the kernel to this function. One request at a time, in float32: slow,
exact, for tests only.
"""

from __future__ import annotations

import math

import torch

from .flashinfer_plan import FlashInferPlan, causal_mask, unpack_segment


def request_mask(plan: FlashInferPlan, i: int, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """bool [q_len, kv_len]: the keys request i's queries see, from the mask bits or the causal rule."""
    if plan.packed_custom_mask is None or plan.mask_indptr is None:
        return causal_mask(q_len, kv_len, device)
    start, end = plan.mask_indptr[i].item(), plan.mask_indptr[i + 1].item()
    if end - start != -(-q_len * kv_len // 8):  # what segment_packbits guarantees, and the kernel assumes
        raise ValueError(f"request {i}: {end - start} mask bytes for {q_len} x {kv_len} bits")
    return unpack_segment(plan.packed_custom_mask, start, q_len * kv_len).view(q_len, kv_len)


def paged_attention(plan: FlashInferPlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    sm_scale: float | None = None) -> torch.Tensor:
    """q [qo_indptr[-1], heads, D]; k_cache, v_cache [pages, page_size, kv_heads, D] (NHD). Returns
    [qo_indptr[-1], heads, D] in q's dtype. sm_scale: 1/sqrt(D) unless given, as in FlashInfer."""
    qo = plan.qo_indptr.tolist()
    kv_ptr = plan.paged_kv_indptr.tolist()
    last = plan.paged_kv_last_page_len.tolist()
    page, kv_heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    heads = q.shape[1]
    if q.shape[0] != qo[-1] or heads % kv_heads or page != plan.page_size:
        raise ValueError(f"q {tuple(q.shape)} and a cache of {kv_heads} KV heads, pages of {page}, "
                         f"do not fit a plan of {qo[-1]} rows and pages of {plan.page_size}")
    group = heads // kv_heads
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for i in range(len(qo) - 1):
        num_pages = kv_ptr[i + 1] - kv_ptr[i]
        if num_pages < 1 or not 1 <= last[i] <= page:
            raise ValueError(f"request {i}: {num_pages} pages, {last[i]} entries in the last")
        kv_len = (num_pages - 1) * page + last[i]
        q_len = qo[i + 1] - qo[i]
        pages = plan.paged_kv_indices[kv_ptr[i] : kv_ptr[i + 1]].to(torch.long)
        # query head h reads KV head h // group: repeat each KV head `group` times in place
        keys = k_cache.index_select(0, pages).reshape(-1, kv_heads, dim)[:kv_len].float()
        values = v_cache.index_select(0, pages).reshape(-1, kv_heads, dim)[:kv_len].float()
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        queries = q[qo[i] : qo[i + 1]].float()
        scores = torch.einsum("qhd,khd->hqk", queries, keys) * scale
        seen = request_mask(plan, i, q_len, kv_len, q.device)
        scores = scores.masked_fill(~seen.unsqueeze(0), float("-inf"))
        out[qo[i] : qo[i + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values).to(q.dtype)
    return out
