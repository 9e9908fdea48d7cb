"""CUDA graphs for the draft's beam steps: every request adds the same number q > 1 of tokens (one per
beam, hung off its tree by `parents`) and wants all q logits; one graph per (batch bucket, q).

Steps 2..d of a beam search (speculation/beam.py) are such forwards, d - 1 of them per iteration, and a
small draft's step is launch overhead when eager, as decode is (decode.py; capture.py holds
the static buffers, buckets, capture and replay both use). The rows of a graph are its bucket's requests
times q: B * q.

Attention: a beam's token sees the committed prefix and its own ancestors in the region, not its
siblings, so the forward runs FlashInfer's prefill wrapper with a custom mask. In graph mode there is one
wrapper per key, made with every buffer its run reads (qo_indptr, page indptr, page indices, last-page
lengths, the packed mask and its byte offsets), and plan() writes the batch's page tables into them and
packs our boolean mask into them, on the host side, before each replay. The contracts, as read in
flashinfer 0.6.18's prefill.py (`BatchPrefillWithPagedKVCacheWrapper.__init__` and `plan`):
- the batch is fixed at construction (len(qo_indptr_buf) - 1): every plan of a key has B requests,
  padding included;
- the first plan fixes the most query rows, and with them the kernels' tile size captured in the graph:
  every plan of a key has exactly B * q rows, the capture's all-padding plan included;
- page indices and mask bytes are copied to the front of their buffers, which must hold them: both sized
  for B requests of max_len keys (each request's mask segment padded to whole bytes); a batch past them
  runs eager (a tree's region can reach a little past max_len);
- a wrapper made with custom_mask_buf always runs masked, which every beam step needs;
- the boolean `custom_mask`, never `packed_custom_mask` (flashinfer PR 2201: plan would keep offsets
  counted in bits), as in FlashInferBackend.

Padding: B - n requests of q tokens each on the scratch blocks (ceil(q / block_size) of them, which the
runner's cache holds beyond those its block manager hands out), each under a causal mask over its q
scratch slots, so every row sees at least itself. All of them write the same q slots; their outputs are
dropped.

Which q: the draft's beam widths above 1 (width 1 is a chain, decode.py's), which the speculation
config bounds (1..w_max), so every key is captured at load, largest first, in one memory pool; a width
not captured runs eager.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..attention.flashinfer_cuda import host_index
from ..attention.flashinfer_plan import pages_for
from ..attention.metadata import AttentionMetadata
from .capture import Capture, Graph, Outputs, StaticForward, bucket_for, buckets_up_to, cuda_capture


def mask_bytes(q: int, kv_len: int) -> int:
    """Bytes of one request's packed mask segment: q * kv_len bits on whole bytes."""
    return -(-q * kv_len // 8)


class TreeGraphs:
    """One graph per (bucket, q) for q in `widths` (those above 1) over `model` with FlashInfer attention
    `backend`, whose cache's blocks from `scratch_block` on (ceil(max q / block_size) of them) belong to no
    sequence. Captured at construction."""

    def __init__(self, model, backend, scratch_block: int, widths: Sequence[int], max_batch: int, max_len: int,
                 capture: Capture = cuda_capture) -> None:
        self.backend = backend
        self.buckets = buckets_up_to(max_batch)
        self.widths = tuple(sorted({q for q in widths if q > 1}))
        if not self.widths:
            raise ValueError(f"beam-step graphs need a width above 1, got {list(widths)}")
        self.page = page = backend.cache.block_size
        top, most = self.buckets[-1], self.widths[-1]
        first = scratch_block * page  # scratch token j sits at slot first + j, across consecutive blocks
        self.static = StaticForward(model, backend, top * most, first, capture)
        device = self.static.ids.device
        i32 = dict(dtype=torch.int32, device=device)
        # what B - n padding requests of q tokens put into the batch, for up to every request
        self.padding_slots = {q: (torch.arange(q, device=device) + first).repeat(top) for q in self.widths}
        self.padding_pages = {q: torch.arange(scratch_block, scratch_block + pages_for(q, page), **i32)
                              for q in self.widths}
        self.padding_masks = {q: torch.ones(q, q, dtype=torch.bool, device=device).tril_().reshape(-1).repeat(top)
                              for q in self.widths}
        # shared by every key: a padding request takes no more pages or mask bytes than one of max_len keys
        self.page_indices = torch.zeros(top * pages_for(max_len, page), **i32)
        self.mask = torch.zeros(top * mask_bytes(most, max_len), dtype=torch.uint8, device=device)
        self.graphs: dict[tuple[int, int], Graph] = {}
        for b in reversed(self.buckets):
            for q in reversed(self.widths):
                wrapper = backend.graph_prefill_wrapper(
                    torch.zeros(b + 1, **i32), torch.zeros(b + 1, **i32), self.page_indices, torch.zeros(b, **i32),
                    self.mask, torch.zeros(b + 1, **i32))
                self._plan(wrapper, b, q, [], torch.zeros(0, **i32), [])  # every request a padding one
                self.graphs[b, q] = self.static.capture(wrapper, b * q)

    def _plan(self, wrapper, b: int, q: int, kv_lens: Sequence[int], indices: torch.Tensor,
              masks: Sequence[torch.Tensor]) -> None:
        """Plan the key's wrapper for the real requests' pages and masks, then the padding requests'."""
        pad = b - len(kv_lens)
        qo_indptr, indptr, last = host_index((q,) * b, tuple(kv_lens) + (q,) * pad, self.page)
        pages = torch.cat([indices, self.padding_pages[q].repeat(pad)])
        mask = torch.cat([m.reshape(-1) for m in masks] + [self.padding_masks[q][: pad * q * q]])
        self.backend.plan_graph_prefill(wrapper, qo_indptr, indptr, pages, last, mask)

    def fits(self, meta: AttentionMetadata) -> bool:
        """Whether a graph replays this forward: every request q new tokens for a captured q, no more
        requests than the largest bucket, its pages and mask bytes within the buffers. (Whether each
        request wants all q logits is the caller's to check: a graph computes them all.)"""
        n = len(meta.q_lens)
        q = meta.q_lens[0] if n else 0
        if not (0 < n <= self.buckets[-1] and q in self.widths and all(x == q for x in meta.q_lens)):
            return False
        pad = bucket_for(n, self.buckets) - n
        pages = sum(pages_for(k, self.page) for k in meta.kv_lens) + pad * pages_for(q, self.page)
        packed = sum(mask_bytes(q, k) for k in meta.kv_lens) + pad * mask_bytes(q, q)
        return pages <= self.page_indices.numel() and packed <= self.mask.numel()

    def run(self, ids: Sequence[int], positions: Sequence[int], meta: AttentionMetadata,
            features: torch.Tensor | None) -> Outputs:
        """Replay the key of this batch (`fits` said yes); returns fresh copies of the real rows."""
        n, q = len(meta.q_lens), meta.q_lens[0]
        b = bucket_for(n, self.buckets)
        graph = self.graphs[b, q]
        self._plan(graph.wrapper, b, q, meta.kv_lens, meta.kv_indices, meta.masks)
        return self.static.replay(graph, ids, positions, meta.slot_mapping, features,
                                  self.padding_slots[q][: (b - n) * q])
