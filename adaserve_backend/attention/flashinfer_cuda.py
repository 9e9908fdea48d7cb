"""Attention on CUDA through FlashInfer's paged kernels (flashinfer-python), planned from our AttentionMetadata.

The inputs come from `flashinfer_plan.build_plan`, whose docstring holds the contracts as read in
flashinfer 0.6.18; `paged_reference.paged_attention` computes from the same plan what the kernels must
(tests/gpu/test_flashinfer_cuda.py holds them to it). Per forward one wrapper runs:

- a batch of one query per request and no tree (plain decode): `BatchDecodeWithPagedKVCacheWrapper`;
- anything else (prefill chunks, token trees under verification, draft beam steps, mixes of them):
  `BatchPrefillWithPagedKVCacheWrapper`, causal and without a mask when every region is a chain, else with
  the batch's boolean mask as `custom_mask`, which plan() packs itself. Never `packed_custom_mask`: with
  it, plan keeps offsets counted in bits where the kernel reads bytes (flashinfer PR 2201).

Positions: `pos_encoding_mode="NONE"`, as our model rotates q and k itself (a tree's tokens sit at
committed + depth, which no kernel-side RoPE knows). KV: our cache's per-layer (k, v) pair is FlashInfer's
NHD layout in its tuple form, handed over as-is.

Both wrappers are pinned to FlashInfer's FA2 kernels. The prefill wrapper settles "auto" at its first
plan, and on Hopper a mask-free first plan settles on FA3, which has no custom mask, so a later tree
would fail; FA2 serves every mask mode from one JIT module per dtype, which tensor-core decode shares:
one compile per dtype (what `tools/gpu_check.py` times). FA3 for long causal prefills is a
measured choice for later, not a default.

Planning reads no device memory except one check of the masks (is every region a chain): the index
arrays plan() needs on the host are built from the metadata's host-side lengths, so plan() does not
copy device ones back. The float workspace (256 MiB: room for the split-KV partials of large tree batches)
is allocated once per device and shared by every backend there: wrappers run one at a time on the stream.
"""

from __future__ import annotations

import functools
import logging

import torch

from ..kv_cache.kv_cache import KVCache
from .flashinfer_plan import FlashInferPlan, build_plan, indptr, last_page_len, pages_for
from .metadata import AttentionMetadata

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 256 * 1024 * 1024  # FlashInfer recommends 128 MiB; vLLM allocates 256
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
KERNEL_BACKEND = "fa2"  # see the module docstring

_workspaces: dict[torch.device, torch.Tensor] = {}


def import_flashinfer():
    """The flashinfer module, or an ImportError that says how to get it."""
    try:
        import flashinfer
    except ImportError as e:
        raise ImportError(
            "attention backend 'flashinfer' needs the flashinfer-python package "
            f"({type(e).__name__}: {e}). Install it with `pip install flashinfer-python` (its kernels compile "
            "on first use, which needs nvcc), or on a machine without network from carried wheels "
            "(docs/gpu.md); or choose attention backend 'torch'."
        ) from e
    return flashinfer


@functools.cache
def flashinfer_importable() -> bool:
    """Whether flashinfer imports here (cached: an import is seconds). A failure is logged once."""
    try:
        import_flashinfer()
    except Exception as e:  # an install missing a dependency raises more than ImportError
        log.info("flashinfer is not usable here, attention falls back to torch: %s", e)
        return False
    return True


def require_cuda(cache: torch.Tensor) -> None:
    if cache.device.type != "cuda":
        raise ValueError(f"attention backend flashinfer needs a CUDA cache, not one on {cache.device}")


def workspace(device: torch.device) -> torch.Tensor:
    """The float workspace of `device`, zeroed once (the CUDA-core decode kernel asks for that)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buf = _workspaces.get(device)
    if buf is None:
        buf = _workspaces[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return buf


def batch_is_causal(meta: AttentionMetadata) -> bool:
    """Whether every sequence's mask is FlashInfer's causal one (all regions are chains), in one
    device read: the masks side by side against the causal rule computed for all of them at once."""
    if not meta.masks:
        return True
    device = meta.masks[0].device
    sizes = [q * k for q, k in zip(meta.q_lens, meta.kv_lens)]
    flat = torch.cat([m.reshape(-1) for m in meta.masks])
    lens = dict(dtype=torch.long, device=device)
    sizes_t = torch.tensor(sizes, **lens)
    starts = torch.cumsum(sizes_t, 0) - sizes_t
    kv = torch.tensor(meta.kv_lens, **lens)
    shift = kv - torch.tensor(meta.q_lens, **lens)  # key k is causal for row q iff k <= q + kv_len - q_len
    seg = torch.repeat_interleave(torch.arange(len(sizes), **lens), sizes_t, output_size=flat.numel())
    local = torch.arange(flat.numel(), **lens) - starts[seg]
    rows, cols = local // kv[seg], local % kv[seg]
    return torch.equal(flat, cols <= rows + shift[seg])


def host_index(q_lens: tuple[int, ...], kv_lens: tuple[int, ...], page: int):
    """qo_indptr, paged_kv_indptr, paged_kv_last_page_len on the host, from the lengths alone."""
    return (
        indptr(q_lens, "cpu"),
        indptr([pages_for(n, page) for n in kv_lens], "cpu"),
        torch.tensor([last_page_len(n, page) for n in kv_lens], dtype=torch.int32),
    )


class FlashInferBackend:
    """The AttentionBackend protocol (backend.py) on FlashInfer, for a bfloat16 or float16 cache on CUDA."""

    cuda_graphs = True

    def __init__(self, kv_cache: KVCache, num_heads: int) -> None:
        cache = kv_cache.data
        require_cuda(cache)
        if cache.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"attention backend flashinfer serves bfloat16 and float16 caches, not {cache.dtype}")
        self.num_kv_heads, self.head_dim = cache.shape[-2], cache.shape[-1]
        if num_heads % self.num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not share {self.num_kv_heads} KV heads evenly")
        flashinfer = import_flashinfer()
        self.cache = kv_cache
        self.num_heads = num_heads
        self.dtype = cache.dtype
        self.layers = [kv_cache.layer(i) for i in range(cache.shape[0])]  # NHD (k, v) per layer, views
        buf = workspace(cache.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(buf, kv_layout="NHD", backend=KERNEL_BACKEND)
        # Tensor-core decode runs the prefill module (no second compile); the CUDA-core decode kernel is a
        # module of its own, neither compiled nor measured here yet.
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            buf, kv_layout="NHD", use_tensor_cores=True, backend=KERNEL_BACKEND)
        self.meta: AttentionMetadata | None = None
        self.plan_inputs: FlashInferPlan | None = None
        self.wrapper = None  # the one planned for this forward

    def plan(self, meta: AttentionMetadata) -> None:
        if meta.page_size != self.cache.block_size:
            raise ValueError(f"metadata pages of {meta.page_size} for a cache of blocks of {self.cache.block_size}")
        p = build_plan(meta, causal=batch_is_causal(meta))
        qo_indptr, kv_indptr, last = host_index(p.q_lens, p.kv_lens, p.page_size)
        common = dict(pos_encoding_mode="NONE", q_data_type=self.dtype, kv_data_type=self.dtype)
        if p.decode_only:
            self.decode.plan(kv_indptr, p.paged_kv_indices, last, self.num_heads, self.num_kv_heads,
                             self.head_dim, p.page_size, **common)
            self.wrapper = self.decode
        else:
            self.prefill.plan(qo_indptr, kv_indptr, p.paged_kv_indices, last, self.num_heads, self.num_kv_heads,
                              self.head_dim, p.page_size, custom_mask=p.custom_mask, causal=p.causal, **common)
            self.wrapper = self.prefill
        self.meta, self.plan_inputs = meta, p

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.meta is not None and self.wrapper is not None, "plan() must run before forward()"
        self.cache.write(layer, self.meta.slot_mapping, k, v)
        return self.run_wrapper(self.wrapper, layer, q)

    def run_wrapper(self, wrapper, layer: int, q: torch.Tensor) -> torch.Tensor:
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return wrapper.run(q, self.layers[layer], out=out)

    # ---- CUDA graphs (cuda_graphs/): a wrapper in graph mode per graph, planned outside ----
    def graph_decode_wrapper(self, indptr_buf: torch.Tensor, indices_buf: torch.Tensor,
                             last_page_len_buf: torch.Tensor):
        """A decode wrapper for graph capture: its batch is len(last_page_len_buf), and plan writes the page
        tables into these buffers, which the captured kernels read."""
        return import_flashinfer().BatchDecodeWithPagedKVCacheWrapper(
            workspace(self.cache.data.device), kv_layout="NHD", use_tensor_cores=True, backend=KERNEL_BACKEND,
            use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf, paged_kv_indices_buffer=indices_buf,
            paged_kv_last_page_len_buffer=last_page_len_buf)

    def plan_graph_decode(self, wrapper, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor):
        """indptr and last_page_len on the host (plan reads them there), indices on the device."""
        wrapper.plan(indptr, indices, last_page_len, self.num_heads, self.num_kv_heads, self.head_dim,
                     self.cache.block_size, pos_encoding_mode="NONE", q_data_type=self.dtype, kv_data_type=self.dtype)

    def graph_prefill_wrapper(self, qo_indptr_buf: torch.Tensor, indptr_buf: torch.Tensor, indices_buf: torch.Tensor,
                              last_page_len_buf: torch.Tensor, mask_buf: torch.Tensor, mask_indptr_buf: torch.Tensor):
        """A prefill wrapper for graph capture, always masked (it is given mask_buf): its batch is
        len(qo_indptr_buf) - 1, its first plan fixes the most query rows, and plan writes the page tables,
        the packed mask (uint8 mask_buf) and its byte offsets into these buffers, which the captured
        kernels read."""
        return import_flashinfer().BatchPrefillWithPagedKVCacheWrapper(
            workspace(self.cache.data.device), kv_layout="NHD", backend=KERNEL_BACKEND, use_cuda_graph=True,
            qo_indptr_buf=qo_indptr_buf, paged_kv_indptr_buf=indptr_buf, paged_kv_indices_buf=indices_buf,
            paged_kv_last_page_len_buf=last_page_len_buf, custom_mask_buf=mask_buf, mask_indptr_buf=mask_indptr_buf)

    def plan_graph_prefill(self, wrapper, qo_indptr: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor,
                           last_page_len: torch.Tensor, custom_mask: torch.Tensor):
        """qo_indptr, indptr and last_page_len on the host; indices and the boolean mask (every request's
        [q_len, kv_len] rows, flat) on the device. plan packs the mask itself (never packed_custom_mask)."""
        wrapper.plan(qo_indptr, indptr, indices, last_page_len, self.num_heads, self.num_kv_heads, self.head_dim,
                     self.cache.block_size, custom_mask=custom_mask, causal=False, pos_encoding_mode="NONE",
                     q_data_type=self.dtype, kv_data_type=self.dtype)
