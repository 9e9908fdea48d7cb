"""What is measured: Llama-3.1-8B's shape, and the batches at it, as (kind, context, tokens) requests over
pages of 16 (built by tools/gpu_batches.py): the attention points (trees, decodes, a mix) and the layer
points (issue 72's targets and the curve of tokens per forward); with the counts the figures derive from
(KV bytes read, query-key pairs, rows that need logits)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tools.gpu_batches import Request

# Llama-3.1-8B
SHAPE = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256, layers=32,
             rope_theta=500000.0)
PAGE = 16


@dataclass(frozen=True)
class Point:
    name: str
    requests: tuple[Request, ...]


def same(kind: str, count: int, n: int, context: int) -> tuple[Request, ...]:
    return tuple((kind, context, n) for _ in range(count))


def attention_points(quick: bool = False) -> list[Point]:
    """Batches of trees (8/32/64 requests x 16-64 tree tokens, contexts 512-4096), decode batches, a mix."""
    trees = [(8, 16, 512), (8, 64, 4096), (32, 16, 1024), (32, 64, 2048), (64, 16, 4096), (64, 32, 1024),
             (64, 64, 4096)]
    decodes = [(8, 2048), (32, 2048), (64, 4096)]
    if quick:
        trees, decodes = [(8, 64, 4096), (32, 64, 2048), (64, 32, 1024)], [(32, 2048)]
    points = [Point(f"{b} trees x {n} @ {c}", same("tree", b, n, c)) for b, n, c in trees]
    points += [Point(f"{b} decodes @ {c}", same("decode", b, 1, c)) for b, c in decodes]
    mix = (("prefill", 0, 512),) + same("tree", 16, 32, 2048) + same("decode", 16, 1, 2048)
    points.append(Point("mix: 512-token prefill + 16 trees x 32 + 16 decodes @ 2048", mix))
    return points


def layer_points(quick: bool = False) -> list[Point]:
    """The issue's targets (batch-1 decode, a 64-token tree at batch 1 and 16, a 2,048-token prefill) and
    the curve of tokens per forward, 1 to 1,024, as min(T, 16) requests of T / min(T, 16) tokens each
    (trees; one token each is decode), all at a context of 1,024."""
    points = [Point("b1 decode", same("decode", 1, 1, 1024)), Point("b1 tree 64", same("tree", 1, 64, 1024)),
              Point("b16 decode", same("decode", 16, 1, 1024)), Point("b16 tree 64", same("tree", 16, 64, 1024)),
              Point("b1 prefill 2048", (("prefill", 0, 2048),))]
    budgets = [1, 4, 16, 64, 256, 1024] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    for t in budgets:
        b = min(t, 16)
        n = t // b
        reqs = same("decode" if n == 1 else "tree", b, n, 1024)
        if all(reqs != p.requests for p in points):
            points.append(Point(f"curve {t} tokens ({b} x {n})", reqs))
    return points


def kv_bytes(meta, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes of keys and values one layer's attention reads."""
    return sum(meta.kv_lens) * kv_heads * head_dim * 2 * itemsize


def logit_rows(requests: Sequence[Request]) -> int:
    """Rows that need logits: every new token of decodes and trees, the last of a prefill chunk."""
    return sum(1 if kind == "prefill" else n for kind, _, n in requests)


def attention_pairs(meta) -> int:
    """Query-key pairs the masks allow (attention FLOPs are 4 x heads x head_dim x pairs per layer)."""
    return int(sum(int(m.sum()) for m in meta.masks))
