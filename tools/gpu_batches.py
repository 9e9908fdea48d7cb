"""Random batches over a paged KV cache, for the GPU tests and `tools/gpu_check.py`'s measurements.

A batch is a list of requests, each `(kind, context, n)`: `context` committed tokens and `n` tokens
computed now, as the engine's forwards see them:

- "decode": one token after the context (a chain);
- "prefill": a chunk of n tokens continuing the context (context 0: a fresh prompt; a chain);
- "tree": a token tree of n tokens over the context (verification): random parents, a forest;
- "beam": a draft beam step: a tree of n tokens drafted earlier sits in the region, and n more hang off it.

The contexts are written in rounds of a few pages per request, so each request's pages are scattered
and interleaved with the others' (as they are after some serving), and their keys and values are
random. Imports torch and this project's kv_cache and attention modules only (the GPU machine runs
this with its own Python).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adaserve_backend.attention.metadata import AttentionMetadata, build_metadata
from adaserve_backend.kv_cache import BlockManager, KVCache, chain_parents

KINDS = ("decode", "prefill", "tree", "beam")
Request = tuple[str, int, int]  # (kind, context, n)


@dataclass
class Batch:
    requests: list[Request]
    blocks: BlockManager
    cache: KVCache
    meta: AttentionMetadata
    positions: torch.Tensor  # int64 [T]: committed + depth of each new token (where RoPE puts it)

    @property
    def num_tokens(self) -> int:
        return sum(self.meta.q_lens)


def random_tree(rng: random.Random, n: int, base: int = 0) -> list[int]:
    """Parents for n tokens appended after a region of `base` tokens (-1 hangs off the prefix)."""
    return [rng.randrange(-1, base + i) if rng.random() < 0.8 else -1 for i in range(n)]


def region(kind: str, n: int, rng: random.Random) -> tuple[list[int], int]:
    """(parents of everything the region holds, how many of its last tokens run now)."""
    if kind == "decode":
        return [-1], 1
    if kind == "prefill":
        return chain_parents(0, n), n
    if kind == "tree":
        return random_tree(rng, n), n
    if kind == "beam":
        drafted = random_tree(rng, n)
        return drafted + random_tree(rng, n, n), n
    raise ValueError(f"unknown request kind {kind!r} (kinds: {', '.join(KINDS)})")


def blocks_needed(requests: Sequence[Request], page: int) -> int:
    return sum(-(-(context + 2 * n) // page) + 1 for _, context, n in requests) + 1


def build(requests: Sequence[Request], *, page: int = 16, kv_heads: int = 8, head_dim: int = 128,
          dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda", layers: int = 1,
          seed: int = 0) -> Batch:
    rng = random.Random(seed)
    num_blocks = blocks_needed(requests, page)
    blocks = BlockManager(num_blocks, page)
    # contexts in rounds of 1-3 pages (plus a ragged bit) per request: scattered, interleaved pages
    left = {i: context for i, (_, context, _) in enumerate(requests)}
    while any(left.values()):
        for i in list(left):
            if left[i]:
                n = min(left[i], rng.randrange(1, 4) * page + rng.randrange(page))
                blocks.append(i, chain_parents(len(blocks.seq(i).region_parents) if blocks.has(i) else 0, n))
                left[i] -= n
    for i in range(len(requests)):
        if blocks.has(i):
            blocks.commit_all(i)
    new = []
    for i, (kind, _, n) in enumerate(requests):
        parents, now = region(kind, n, rng)
        blocks.append(i, parents)
        new.append((i, now))
    gen = torch.Generator(device=device).manual_seed(seed)
    cache = KVCache(layers, kv_heads, head_dim, num_blocks, page, dtype, device)
    cache.data.normal_(generator=gen)
    meta = build_metadata(blocks, new, device)
    positions = []
    for i, now in new:
        s = blocks.seq(i)
        positions.extend(s.num_committed + d for d in s.region_depths[-now:])
    return Batch(list(requests), blocks, cache, meta, torch.tensor(positions, dtype=torch.long, device=device))


def random_requests(rng: random.Random, count: int, max_context: int = 700, max_chunk: int = 300,
                    max_tree: int = 64, kinds: Sequence[str] = KINDS) -> list[Request]:
    """A mixed batch of `count` requests of the given kinds, sizes drawn at random."""
    out = []
    for _ in range(count):
        kind = rng.choice(list(kinds))
        if kind == "decode":
            out.append((kind, rng.randrange(1, max_context), 1))
        elif kind == "prefill":
            out.append((kind, rng.choice([0, 0, rng.randrange(1, max_context)]), rng.randrange(1, max_chunk)))
        else:
            out.append((kind, rng.randrange(1, max_context), rng.randrange(2, max_tree + 1)))
    return out


def qkv(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, seed: int = 0):
    """Random q [T, heads, D], k and v [T, kv_heads, D]; q is a view into one fused [T, heads + 2 kv_heads, D]
    tensor, as the model's rotated projections are (its rows are not contiguous)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    fused = torch.randn(num_tokens, heads + 2 * kv_heads, head_dim, generator=gen, dtype=dtype, device=device)
    return fused.split([heads, kv_heads, kv_heads], dim=1)
