"""A model forward captured as a CUDA graph over static buffers, and replayed: what the graphs of plain
decode (decode.py) and of the draft's beam steps (tree.py) share.

A captured forward reads nothing but buffers made once: token ids, positions, the KV slots its K and V
go to, a feature draft's features, and the page tables (and mask) its FlashInfer wrapper in graph mode
is planned into before each replay. A batch of n real rows replays a graph of `rows` >= n; the rows
past n are padding, pointed at scratch KV slots no sequence owns, and their outputs are dropped.

Batches are bucketed by requests: 1, 2, 4, 8, then every multiple of 8, so padding costs at most 7
requests beyond 8, and a forward's cost hardly grows with rows at these sizes.

`capture` is the seam the CPU tests use: there no graph can be captured, and `eager_capture`'s replay
reruns the function into the same static outputs, which checks every buffer, padding row and plan the
GPU path uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # hidden, features, logits (float32)
Capture = Callable[[Callable[[], Outputs], object], tuple[Callable[[], None], Outputs]]


def buckets_up_to(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8, up to max_batch (included)."""
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
class Graph:
    rows: int  # the static rows it computes, padding included
    wrapper: object  # its FlashInfer wrapper in graph mode, planned before each replay
    replay: Callable[[], None]
    out: Outputs


class StaticAttention:
    """The attention backend as a captured forward sees it: K/V written at the static slots, the graph's
    wrapper run over the page tables planned into its buffers."""

    def __init__(self, backend) -> None:
        self.backend, self.slots, self.wrapper = backend, None, None

    def use(self, wrapper, slots: torch.Tensor) -> None:
        self.wrapper, self.slots = wrapper, slots

    def forward(self, layer: int, q, k, v):
        self.backend.cache.write(layer, self.slots, k, v)
        return self.backend.run_wrapper(self.wrapper, layer, q)


class StaticForward:
    """The static inputs of up to `rows` rows of `model` (slots first at `idle_slot`, a scratch slot, so the
    warm-up runs of a capture write nowhere that matters) and the graphs captured over them, in one memory
    pool.

    A feature draft's static features are h wide (hidden_size): what its layers read. An EAGLE-3 draft
    fuses the target's wider taps into that width itself and reads its own h-wide outputs as they are, so
    taps are fused here before the copy (the same GEMM the eager forward runs, over the same rows) and one
    graph serves a chain's taps and the beams' own features alike."""

    def __init__(self, model, backend, rows: int, idle_slot: int, capture: Capture = cuda_capture) -> None:
        self.model, self._capture = model, capture
        weight = model.embed_tokens.weight
        long = dict(dtype=torch.long, device=weight.device)
        self.ids = torch.zeros(rows, **long)
        self.positions = torch.zeros(rows, **long)
        self.slots = torch.full((rows,), idle_slot, **long)
        self.features = (torch.zeros(rows, model.spec.hidden_size, dtype=weight.dtype, device=weight.device)
                         if model.takes_features else None)
        self.attn = StaticAttention(backend)
        self.pool = torch.cuda.graph_pool_handle() if weight.device.type == "cuda" else None

    def capture(self, wrapper, rows: int) -> Graph:
        """The graph of the first `rows` rows, attention through `wrapper` (planned already)."""
        self.attn.use(wrapper, self.slots[:rows])
        replay, out = self._capture(lambda: self._forward(rows), self.pool)
        return Graph(rows, wrapper, replay, out)

    def _forward(self, rows: int) -> Outputs:
        feats = self.features[:rows] if self.features is not None else None
        hidden, features = self.model.run(self.ids[:rows], self.positions[:rows], self.attn, feats)
        return hidden, features, self.model.compute_logits(hidden)

    def replay(self, graph: Graph, ids: Sequence[int], positions: Sequence[int], slots: torch.Tensor,
               features: torch.Tensor | None, padding_slots: torch.Tensor) -> Outputs:
        """Load the real rows and the padding rows' slots, replay `graph` (its wrapper planned for this
        batch already); returns fresh copies of the real rows (the next replay rewrites the static ones)."""
        n = len(ids)
        self.ids[:n].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.long), non_blocking=True)
        self.slots[:n].copy_(slots)
        self.slots[n : graph.rows].copy_(padding_slots)
        if self.features is not None:
            if features.shape[-1] != self.features.shape[-1]:
                features = self.model.fuse(features, self.features.dtype)
            self.features[:n].copy_(features)
        self.attn.use(graph.wrapper, self.slots[: graph.rows])  # what a rerun reads (a captured graph has its own)
        graph.replay()
        return tuple(t[:n].clone() for t in graph.out)
