"""Attention metadata for one batched forward: which KV slots each sequence's new tokens read, and
which of them each new token may see.

The paged layout (kv_indptr, kv_indices, per-sequence masks over [q_len, kv_len]) is the one
FlashInfer's `BatchPrefillWithPagedKVCacheWrapper.plan` takes, so a CUDA backend can plan from these
fields plus offsets it derives from q_lens / kv_lens; the torch backend builds padded gather indices
and masks from them.

One representation covers every kind of step: a sequence's new tokens are the tail of its uncommitted
region (see `kv_cache.block_manager`), and a new token sees the whole committed prefix plus its own
ancestors in the region. A chain region gives causal prefill (also a chunk continuing a prefix) and
single-token decode; a tree region gives draft beam steps and token-tree verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..kv_cache.block_manager import BlockManager


@dataclass(frozen=True)
class AttentionMetadata:
    page_size: int
    q_lens: list[int]  # host-side copies so planning needs no device sync
    kv_lens: list[int]
    kv_indptr: torch.Tensor  # int32 [B+1], offsets into kv_indices
    kv_indices: torch.Tensor  # int32 [pages], block ids
    masks: list[torch.Tensor]  # per sequence, bool [q_len, kv_len]
    prefix_lens: list[int]  # per sequence, keys every new token sees (the committed prefix)
    slot_mapping: torch.Tensor  # int64 [T], where each new token's K/V is written


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """bool [n, n] on the host: entry (i, j) is True iff j is i or an ancestor of i (parents[i] < i, -1 = root)."""
    n = len(parents)
    if is_chain(parents):
        return torch.ones(n, n, dtype=torch.bool, device="cpu").tril_()
    rows: list[int] = []  # each row as an int bitmask: a tree region is small, bit ops are cheap
    for i, p in enumerate(parents):
        rows.append((rows[p] if p >= 0 else 0) | (1 << i))
    bits = torch.tensor([[(r >> j) & 1 for j in range(n)] for r in rows], dtype=torch.bool, device="cpu")
    return bits


def build_metadata(
    blocks: BlockManager, new_tokens: Sequence[tuple[int, int]], device: torch.device | str
) -> AttentionMetadata:
    """`new_tokens`: (seq_id, q_len) per sequence, q_len being how many tokens at the end of that
    sequence's region this forward computes (already appended to `blocks`)."""
    page = blocks.block_size
    q_lens, kv_lens, masks, slots, prefixes = [], [], [], [], []
    kv_indptr, kv_indices = [0], []
    for seq_id, q_len in new_tokens:
        s = blocks.seq(seq_id)
        region = len(s.region_parents)
        if not 0 < q_len <= region:
            raise ValueError(f"sequence {seq_id}: {q_len} new tokens but a region of {region}")
        kv_len = s.num_slots
        anc = ancestor_mask(s.region_parents)[region - q_len :]
        # built on the host, one copy to the device per sequence
        seen = torch.ones(q_len, s.num_committed, dtype=torch.bool, device="cpu")
        masks.append(torch.cat([seen, anc], dim=1).to(device))
        pages = blocks.blocks_for(kv_len)
        kv_indices.extend(s.block_table[:pages])
        kv_indptr.append(len(kv_indices))
        slots.extend(blocks.slot(s, i) for i in range(kv_len - q_len, kv_len))
        q_lens.append(q_len)
        kv_lens.append(kv_len)
        prefixes.append(s.num_committed)
    i32 = dict(dtype=torch.int32, device=device)
    return AttentionMetadata(
        page_size=page,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kv_indptr=torch.tensor(kv_indptr, **i32),
        kv_indices=torch.tensor(kv_indices, **i32),
        masks=masks,
        prefix_lens=prefixes,
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
    )
