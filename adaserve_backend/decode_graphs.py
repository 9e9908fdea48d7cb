"""CUDA graphs for plain decode: one request, one new token, one logit row each, batches up to a bucket.

A decode forward on a GPU is mostly launch overhead when eager: a few hundred small kernels whose
launches take longer from Python than the GPU takes to read the weights. A graph per batch-size bucket
replays all of them in one launch. Everything a graph reads lives in static buffers made once: the
token ids, positions, KV slots, features (for a feature draft) and FlashInfer's page tables; a batch of
b requests replays the smallest bucket B >= b, its B - b padding rows pointing at a scratch KV block no
sequence owns (the runner's cache holds one block more than its block manager hands out). Their outputs
are dropped.

FlashInfer's decode wrapper in graph mode (`use_cuda_graph=True`, one wrapper per bucket, fixed-size
index buffers) is planned outside the graph before each replay: plan is host work that writes the page
tables into the buffers the captured kernels read. Graphs run only where the attention is FlashInfer:
the SDPA fallback sizes its work by the batch's lengths on the host. Trees, prefill chunks and draft
beam steps of several tokens run eager, as does a batch larger than the largest bucket.

`capture` is the seam the CPU tests use: there no graph can be captured, and a replay that reruns the
function into the same static outputs checks every buffer, padding and plan the GPU path uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .attention.flashinfer_plan import pages_for
from .attention.metadata import AttentionMetadata

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # hidden, features, logits (float32)


def buckets_up_to(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8, up to max_batch (included): padding costs at most 7 rows
    beyond 8, and decode's cost hardly grows with rows at these sizes."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return tuple(sorted(set(s for s in sizes if 0 < s <= max_batch)))


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    return next((b for b in buckets if b >= n), None)


def cuda_capture(fn: Callable[[], Outputs], pool) -> tuple[Callable[[], None], Outputs]:
    """Warm fn up on a side stream (torch's recipe: lazy inits and allocator growth stay out of the
    graph), then capture it; returns (replay, the graph's static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph.replay, out


def eager_capture(fn: Callable[[], Outputs], pool) -> tuple[Callable[[], None], Outputs]:
    """The CPU tests' capture: the replay reruns fn and copies its results into the first call's tensors,
    so readers see the same static outputs as after a graph's replay."""
    out = fn()

    def replay() -> None:
        for static, fresh in zip(out, fn()):
            static.copy_(fresh)

    return replay, out


@dataclass
class _Graph:
    batch: int
    wrapper: object  # FlashInfer's decode wrapper of this bucket, planned before each replay
    replay: Callable[[], None]
    out: Outputs


class _StaticAttention:
    """The attention backend as a captured forward sees it: K/V written at the static slots, the bucket's
    wrapper run over the static page tables."""

    def __init__(self, backend) -> None:
        self.backend, self.slots, self.wrapper = backend, None, None

    def use(self, wrapper, slots: torch.Tensor) -> None:
        self.wrapper, self.slots = wrapper, slots

    def forward(self, layer: int, q, k, v):
        self.backend.cache.write(layer, self.slots, k, v)
        return self.backend.run_wrapper(self.wrapper, layer, q)


class DecodeGraphs:
    """One graph per bucket over `model` with FlashInfer attention `backend`, whose cache's block
    `scratch_block` belongs to no sequence. Captured at construction, largest bucket first (the graphs
    share one memory pool)."""

    def __init__(self, model, backend, scratch_block: int, max_batch: int, max_len: int,
                 capture: Callable = cuda_capture) -> None:
        self.model, self.backend = model, backend
        self.buckets = buckets_up_to(max_batch)
        self.page = backend.cache.block_size
        self.scratch_block = scratch_block
        device = model.embed_tokens.weight.device
        top = self.buckets[-1]
        long = dict(dtype=torch.long, device=device)
        self.ids = torch.zeros(top, **long)
        self.positions = torch.zeros(top, **long)
        self.slots = torch.full((top,), scratch_block * self.page, **long)
        self.features = (torch.zeros(top, model.fc.in_features, dtype=model.embed_tokens.weight.dtype,
                                     device=device) if model.takes_features else None)
        i32 = dict(dtype=torch.int32, device=device)
        # every request's pages at the longest sequence, plus the padding rows' scratch page each
        self.page_indices = torch.zeros(top * (pages_for(max_len, self.page) + 1), **i32)
        self.attn = _StaticAttention(backend)
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[int, _Graph] = {}
        for b in reversed(self.buckets):
            wrapper = backend.graph_decode_wrapper(torch.zeros(b + 1, **i32), self.page_indices,
                                                   torch.zeros(b, **i32))
            self._plan(wrapper, b, [], [], torch.zeros(0, **i32))  # every row a padding row
            self.attn.use(wrapper, self.slots[:b])
            replay, out = capture(lambda b=b: self._forward(b), pool)
            self.graphs[b] = _Graph(b, wrapper, replay, out)

    def _forward(self, b: int) -> Outputs:
        feats = self.features[:b] if self.features is not None else None
        hidden, features = self.model.run(self.ids[:b], self.positions[:b], self.attn, feats)
        return hidden, features, self.model.compute_logits(hidden)

    def _plan(self, wrapper, b: int, kv_lens: Sequence[int], page_counts: Sequence[int],
              indices: torch.Tensor) -> None:
        """Plan the bucket's wrapper for the real requests' pages, then one scratch page per padding row."""
        pad = b - len(kv_lens)
        counts = list(page_counts) + [1] * pad
        indptr = [0]
        for n in counts:
            indptr.append(indptr[-1] + n)
        last = [n - (pages_for(n, self.page) - 1) * self.page for n in kv_lens] + [1] * pad
        scratch = torch.full((pad,), self.scratch_block, dtype=torch.int32, device=indices.device)
        self.backend.plan_graph_decode(wrapper, torch.tensor(indptr, dtype=torch.int32),
                                       torch.cat([indices, scratch]), torch.tensor(last, dtype=torch.int32))

    def fits(self, num_requests: int) -> bool:
        return 0 < num_requests <= self.buckets[-1]

    def run(self, ids: Sequence[int], positions: Sequence[int], meta: AttentionMetadata,
            features: torch.Tensor | None) -> Outputs:
        """Replay the bucket of len(ids) single-token requests; returns fresh copies of the real rows
        (the static outputs are rewritten by the next replay)."""
        n = len(ids)
        graph = self.graphs[bucket_for(n, self.buckets)]
        b = graph.batch
        self.ids[:n].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.long), non_blocking=True)
        self.slots[:n].copy_(meta.slot_mapping)
        self.slots[n:b].fill_(self.scratch_block * self.page)
        if self.features is not None:
            self.features[:n].copy_(features)
        pages = [pages_for(k, self.page) for k in meta.kv_lens]
        self._plan(graph.wrapper, b, meta.kv_lens, pages, meta.kv_indices)
        self.attn.use(graph.wrapper, self.slots[:b])  # what a rerun reads (a captured graph has its own)
        graph.replay()
        return tuple(t[:n].clone() for t in graph.out)
