"""Reusing a cached prefix when a request starts (kv_cache/block_pool.py has the cache itself).

The target and draft caches are matched together: a request skips a prefix only where both hold it,
in whole blocks of each, so the draft never has to read tokens the target did not compute features
for. What is left to prefill always includes the last token: its logits give the next token."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kv_cache import BlockManager
from ..sequence import Sequence


@dataclass
class PrefixStats:
    """Tokens the starting requests asked the cache for, and those it had (the hit rate's terms)."""

    queried: int = 0
    hit: int = 0


def common_prefix(seq: Sequence, caches: list[BlockManager]) -> tuple[int, list]:
    """The longest prefix of `seq` that every cache holds, in tokens (whole blocks of each), and each
    cache's match; the last token is never included (the next token comes from its logits)."""
    if not all(c.prefix_caching for c in caches):
        return 0, []
    limit = len(seq.tokens) - 1
    matches = [c.match(seq.tokens, limit, seq.block_keys.setdefault(c.block_size, []), seq.cache_root)
               for c in caches]
    step = math.lcm(*(c.block_size for c in caches))
    return min(len(blocks) * c.block_size for (blocks, _), c in zip(matches, caches)) // step * step, matches


def caches_of(target: BlockManager, draft: BlockManager | None) -> list[BlockManager]:
    return [target] + ([draft] if draft is not None else [])


def reuse_prefix(seq: Sequence, target: BlockManager, draft: BlockManager | None, stats: PrefixStats) -> int:
    """Attach the longest prefix of `seq` that every cache holds and count it as prefilled; returns its
    length in tokens (0 without prefix caching or without a hit)."""
    caches = caches_of(target, draft)
    tokens, matches = common_prefix(seq, caches)
    seq.cached_prefix = 0
    if matches:
        stats.queried += max(len(seq.tokens) - 1, 0)
    if tokens:
        for c, (blocks, keys) in zip(caches, matches):
            n = tokens // c.block_size
            c.attach(seq.seq_id, blocks[:n], keys[:n])
        seq.prefilled = tokens
        stats.hit += tokens
    return tokens


def note_cached_prefixes(waiting, target: BlockManager, draft: BlockManager | None) -> None:
    """Each waiting request's prefix the caches hold now, for its first-token prediction (a request
    whose prompt is mostly cached must not be refused as if it had to prefill all of it)."""
    caches = caches_of(target, draft)
    for seq in waiting:
        if not target.has(seq.seq_id) and seq.request.prompt_logprobs is None:  # a scored prompt: computed whole
            seq.cached_prefix = common_prefix(seq, caches)[0]
