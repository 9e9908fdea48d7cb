"""The inputs FlashInfer's paged attention is planned with, built from our AttentionMetadata in plain torch.

Nothing here imports flashinfer, so it runs (and is tested) on the CPU; on CUDA the same code builds the
same tensors on the metadata's device. `paged_reference.py` computes, from exactly these tensors, what
the kernel must; the CUDA backend hands them to the wrappers.

Contracts, as read in flashinfer 0.6.18 (flashinfer/prefill.py `BatchPrefillWithPagedKVCacheWrapper.plan`
and `.run`, `_compute_page_mask_indptr`; flashinfer/decode.py `BatchDecodeWithPagedKVCacheWrapper.plan`;
flashinfer/quantization/packbits.py `segment_packbits`; include/flashinfer/attention/variants.cuh
`DefaultAttention` and prefill.cuh's causal test; docs/tutorials/kv_layout.rst):

- Pages. Request i reads the pages `paged_kv_indices[paged_kv_indptr[i]:paged_kv_indptr[i+1]]`, all full
  but the last, which holds `paged_kv_last_page_len[i]` entries, 1 to page_size: its KV length is
  `page_size * (pages - 1) + last_page_len`. Queries are ragged: request i's are rows
  `qo_indptr[i]:qo_indptr[i+1]` of q [T, heads, D]. Every index array is int32 (int64 misindexes).
- KV layout. Our cache is one [layers, 2, blocks, block_size, kv_heads, D] buffer, so `KVCache.layer(i)`
  gives K and V as two contiguous [blocks, block_size, kv_heads, D] tensors: FlashInfer's NHD layout in
  its tuple form, `run(q, (k_cache, v_cache))` with `kv_layout="NHD"`. The cache is passed as-is on
  CUDA, no copy and no other layout. Its single-tensor form ([pages, 2, page_size, kv_heads, D], K and V
  interleaved per page) is not ours, which is why the tuple. HND pays only for fp8 KV or the trtllm-gen
  backend (which transposes NHD itself); bf16 and fp16 run NHD directly.
- Custom mask. Per request a [qo_len, kv_len] boolean matrix (True: attend), flattened row-major; the
  kernel reads bit `q * kv_len + k` of the request's segment as bit `(b % 8)` of byte `b // 8` (little
  bit order) from byte `mask_indptr[i]` on. Each request's segment is padded to whole bytes, so
  mask_indptr counts bytes: what `segment_packbits(..., bitorder="little")` returns.
  Trap: `plan(packed_custom_mask=...)` without `custom_mask` keeps the indptr `_compute_page_mask_indptr`
  gives, which counts bits, while the kernel adds it to a byte pointer: wrong for more than one request
  (open upstream as flashinfer PR 2201). The CUDA backend therefore passes `custom_mask` (our boolean
  mask, on the GPU) and lets plan pack it; `packed_custom_mask` and `mask_indptr` here are what its
  packing must produce, for the reference and for a GPU test that compares the two.
- Custom masks are one mode for the whole launch: one tree in a batch makes every request carry mask
  bits. Without a mask, `causal=True` hides key k from query q iff `k + qo_len > kv_len + q` (aligned to
  the end of the KV), which is exactly what a chain region sees (prefill chunks, plain decode), so an
  all-chain batch plans with no mask at all.
- Positions. Neither wrapper's `plan` or `run` takes positions: with `pos_encoding_mode="NONE"` (the
  default) the kernel applies no RoPE. Our model rotates q and k itself at committed + depth (see
  `ModelRunner.forward`) before K is written to the cache, which is what a tree needs; ROPE_LLAMA would
  place a query at `kv_len - qo_len + row`, wrong for every branch but the first.
- Scale and GQA: `sm_scale` defaults to 1/sqrt(head_dim) and query head h reads KV head
  h // (heads / kv_heads), as torch's SDPA with `enable_gqa`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .metadata import AttentionMetadata

# bit b of each packed byte carries the mask element 8 * byte + b ("little" bit order)
_BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class FlashInferPlan:
    page_size: int
    qo_indptr: torch.Tensor  # int32 [B+1]
    paged_kv_indptr: torch.Tensor  # int32 [B+1]
    paged_kv_indices: torch.Tensor  # int32 [pages]
    paged_kv_last_page_len: torch.Tensor  # int32 [B], each in [1, page_size]
    # None for an all-chain batch, planned causal. Else the boolean mask the CUDA backend hands to
    # plan(custom_mask=) (bool [sum q_len * kv_len]), its bit-packed bytes and their byte offsets.
    custom_mask: torch.Tensor | None
    packed_custom_mask: torch.Tensor | None  # uint8 [mask_indptr[-1]]
    mask_indptr: torch.Tensor | None  # int32 [B+1], in bytes
    q_lens: tuple[int, ...]  # host-side copies, so a caller needs no device sync to size things
    kv_lens: tuple[int, ...]

    @property
    def causal(self) -> bool:
        return self.custom_mask is None

    @property
    def decode_only(self) -> bool:
        """One query per request and no mask: BatchDecodeWithPagedKVCacheWrapper takes the same pages."""
        return self.causal and all(n == 1 for n in self.q_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)


def indptr(lengths: Sequence[int], device: torch.device | str) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def pages_for(kv_len: int, page_size: int) -> int:
    return -(-kv_len // page_size)


def last_page_len(kv_len: int, page_size: int) -> int:
    """Entries in the last page, 1 to page_size (a full last page counts page_size, never 0)."""
    return kv_len - (pages_for(kv_len, page_size) - 1) * page_size


def pack_segments(bits: torch.Tensor, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack consecutive segments of a flat boolean tensor, each on its own whole bytes, little bit order.

    Returns (uint8 bytes, int32 byte offsets [len(lengths)+1]), as flashinfer's `segment_packbits` with
    bitorder="little". Vectorised: each bit is scattered to its place in a zero-padded stream, and every
    8 bits of the stream are summed with their weights; segment lengths are host ints, so sizing the
    result needs no device sync."""
    device = bits.device
    if any(n < 0 for n in lengths) or sum(lengths) != bits.numel():
        raise ValueError(f"segments of {sum(lengths)} bits for a mask of {bits.numel()}")
    padded = [-(-n // 8) * 8 for n in lengths]
    # shift of each segment from its place in `bits` to its place in the padded stream
    shifts, src, dst = [], 0, 0
    for n, p in zip(lengths, padded):
        shifts.append(dst - src)
        src, dst = src + n, dst + p
    total = bits.numel()
    shift = torch.repeat_interleave(torch.tensor(shifts, dtype=torch.long, device=device),
                                    torch.tensor(list(lengths), dtype=torch.long, device=device), output_size=total)
    stream = torch.zeros(dst, dtype=torch.int32, device=device)
    stream[torch.arange(total, device=device) + shift] = bits.reshape(-1).to(torch.int32)
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.int32, device=device)
    packed = (stream.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)
    return packed, indptr([p // 8 for p in padded], device)


def unpack_segment(packed: torch.Tensor, byte_start: int, num_bits: int) -> torch.Tensor:
    """The first num_bits bits (bool) of the segment starting at byte byte_start: the kernel's read."""
    data = packed[byte_start : byte_start + -(-num_bits // 8)].to(torch.int32)
    shifts = torch.arange(8, dtype=torch.int32, device=packed.device)
    return ((data.unsqueeze(1) >> shifts) & 1).reshape(-1)[:num_bits].to(torch.bool)


def unpack_segments(packed: torch.Tensor, byte_indptr: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Inverse of pack_segments: the flat boolean tensor of the segments' bits, padding dropped."""
    starts = byte_indptr.tolist()
    parts = [unpack_segment(packed, starts[i], n) for i, n in enumerate(lengths)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool, device=packed.device)


def causal_mask(q_len: int, kv_len: int, device: torch.device | str) -> torch.Tensor:
    """bool [q_len, kv_len]: what FlashInfer's causal mode lets each query see (aligned to the KV end)."""
    rows = torch.arange(q_len, device=device).unsqueeze(1)
    return torch.arange(kv_len, device=device).unsqueeze(0) <= rows + (kv_len - q_len)


def is_causal(masks: Sequence[torch.Tensor]) -> bool:
    """Whether every mask is FlashInfer's causal one (a chain region). On CUDA one sync per sequence."""
    return all(torch.equal(m, causal_mask(m.shape[0], m.shape[1], m.device)) for m in masks)


def build_plan(meta: AttentionMetadata, causal: bool | None = None) -> FlashInferPlan:
    """The plan inputs for one forward, on the metadata's device.

    causal: None detects an all-chain batch from the masks (a sync per sequence on CUDA); a caller that
    knows (only prefill chunks and plain decode in the batch) says True, and False forces a mask."""
    device = meta.kv_indices.device
    page = meta.page_size
    for q_len, kv_len, m in zip(meta.q_lens, meta.kv_lens, meta.masks):
        if not 0 < q_len <= kv_len or tuple(m.shape) != (q_len, kv_len):
            raise ValueError(f"a sequence with {q_len} queries over {kv_len} keys has a {tuple(m.shape)} mask")
    pages = [pages_for(n, page) for n in meta.kv_lens]
    if sum(pages) != meta.kv_indices.numel():
        raise ValueError(f"{meta.kv_indices.numel()} page indices for {sum(pages)} pages")
    if causal is None:
        causal = is_causal(meta.masks)
    custom = packed = mask_indptr = None
    if not causal:
        custom = torch.cat([m.reshape(-1) for m in meta.masks]).to(torch.bool)
        packed, mask_indptr = pack_segments(custom, [q * k for q, k in zip(meta.q_lens, meta.kv_lens)])
    return FlashInferPlan(
        page_size=page,
        qo_indptr=indptr(meta.q_lens, device),
        # built from host lengths rather than copied from meta.kv_indptr: equal by construction
        # (build_metadata lists each sequence's first pages_for(kv_len) blocks), and no device read
        paged_kv_indptr=indptr(pages, device),
        paged_kv_indices=meta.kv_indices.to(torch.int32),
        paged_kv_last_page_len=torch.tensor([last_page_len(n, page) for n in meta.kv_lens],
                                            dtype=torch.int32, device=device),
        custom_mask=custom,
        packed_custom_mask=packed,
        mask_indptr=mask_indptr,
        q_lens=tuple(meta.q_lens),
        kv_lens=tuple(meta.kv_lens),
    )
