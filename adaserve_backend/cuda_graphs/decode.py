"""CUDA graphs for plain decode: one request, one new token, one logit row each, batches up to a bucket.

A decode forward on a GPU is mostly launch overhead when eager: a few hundred small kernels whose
launches take longer from Python than the GPU takes to read the weights. A graph per batch-size bucket
(capture.py: the static buffers, buckets, capture and replay) replays all of them in one launch. A
batch of b requests replays the smallest bucket B >= b, its B - b padding rows writing and reading one
scratch KV slot no sequence owns (the runner's cache holds blocks beyond those its block manager hands
out).

FlashInfer's decode wrapper in graph mode (`use_cuda_graph=True`, one wrapper per bucket, fixed-size
index buffers) is planned outside the graph before each replay: plan is host work that writes the page
tables into the buffers the captured kernels read. Graphs run only where the attention is FlashInfer:
the SDPA fallback sizes its work by the batch's lengths on the host. The draft's beam steps of several
tokens per request replay graphs of their own (tree.py); trees under verification, prefill chunks
and a batch larger than the largest bucket run eager.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..attention.flashinfer_cuda import host_index
from ..attention.flashinfer_plan import pages_for
from ..attention.metadata import AttentionMetadata
from .capture import Capture, Graph, Outputs, StaticForward, bucket_for, buckets_up_to, cuda_capture


class DecodeGraphs:
    """One graph per bucket over `model` with FlashInfer attention `backend`, whose cache's block
    `scratch_block` belongs to no sequence. Captured at construction, largest bucket first (the graphs
    share one memory pool)."""

    def __init__(self, model, backend, scratch_block: int, max_batch: int, max_len: int,
                 capture: Capture = cuda_capture) -> None:
        self.backend = backend
        self.buckets = buckets_up_to(max_batch)
        self.page = backend.cache.block_size
        self.scratch_block = scratch_block
        top = self.buckets[-1]
        self.static = StaticForward(model, backend, top, scratch_block * self.page, capture)
        device = self.static.ids.device
        self.padding_slots = torch.full((top,), scratch_block * self.page, dtype=torch.long, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        # every request's pages at the longest sequence, plus the padding rows' scratch page each
        self.page_indices = torch.zeros(top * (pages_for(max_len, self.page) + 1), **i32)
        self.graphs: dict[int, Graph] = {}
        for b in reversed(self.buckets):
            wrapper = backend.graph_decode_wrapper(torch.zeros(b + 1, **i32), self.page_indices,
                                                   torch.zeros(b, **i32))
            self._plan(wrapper, b, [], torch.zeros(0, **i32))  # every row a padding row
            self.graphs[b] = self.static.capture(wrapper, b)

    def _plan(self, wrapper, b: int, kv_lens: Sequence[int], indices: torch.Tensor) -> None:
        """Plan the bucket's wrapper for the real requests' pages, then one scratch page per padding row."""
        pad = b - len(kv_lens)
        _, indptr, last = host_index((1,) * b, tuple(kv_lens) + (1,) * pad, self.page)
        scratch = torch.full((pad,), self.scratch_block, dtype=torch.int32, device=indices.device)
        self.backend.plan_graph_decode(wrapper, indptr, torch.cat([indices, scratch]), last)

    def fits(self, num_requests: int) -> bool:
        return 0 < num_requests <= self.buckets[-1]

    def run(self, ids: Sequence[int], positions: Sequence[int], meta: AttentionMetadata,
            features: torch.Tensor | None) -> Outputs:
        """Replay the bucket of len(ids) single-token requests; returns fresh copies of the real rows."""
        n = len(ids)
        graph = self.graphs[bucket_for(n, self.buckets)]
        self._plan(graph.wrapper, graph.rows, meta.kv_lens, meta.kv_indices)
        return self.static.replay(graph, ids, positions, meta.slot_mapping, features,
                                  self.padding_slots[: graph.rows - n])
