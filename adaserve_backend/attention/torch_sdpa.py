"""Attention with torch's scaled_dot_product_attention and explicit masks (CPU and CUDA).

Sequences are padded into [B, heads, max_q, max_kv] problems: one gather of K/V and one SDPA call per
layer for a group of sequences, instead of a Python loop over sequences. One group for everything
wastes most of the work when shapes differ: a 64-token prefill chunk riding along with eight decode
trees of 6 tokens pads every tree to 64 queries (9 x 64 query rows for 112 real ones). Sequences are
therefore grouped (`group_sequences`) so that padding costs less than the extra SDPA call would.

In bfloat16 (and float16) the query heads that share a KV head are folded into the query length, so
SDPA sees a plain multi-head problem of kv_heads heads with heads/kv_heads times the queries: torch's
CPU kernel has a fast path for that shape and none for `enable_gqa`, with bit-identical outputs for
masked problems (evidence: docs/architecture.md#the-model-runtime). float32 keeps the unfolded call:
its single-query kernel rounds differently when folded (1e-7), and float32 is the exact oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kv_cache.kv_cache import KVCache
from .metadata import AttentionMetadata

# The fixed cost of one more SDPA call per layer (gathers of K, V and the queries, the call, a copy
# back), in query-key pairs of attention work: the ratio of a call's overhead to one pair's cost on the
# CPU it was tuned for (evidence: docs/architecture.md#the-model-runtime).
GROUP_OVERHEAD_PAIRS = 3072


def padded_pairs(q_lens: Sequence[int], kv_lens: Sequence[int]) -> int:
    return len(q_lens) * max(q_lens) * max(kv_lens)


def group_sequences(q_lens: Sequence[int], kv_lens: Sequence[int], overhead: int) -> list[list[int]]:
    """Partition sequence indices into groups padded together, greedily (largest query first):
    each sequence joins the group whose padded work grows least, unless a group of its own (its own
    work plus `overhead`) is cheaper. Groups list indices in increasing order."""
    groups: list[list[int]] = []
    for i in sorted(range(len(q_lens)), key=lambda j: (-q_lens[j], -kv_lens[j], j)):
        best, best_cost = None, q_lens[i] * kv_lens[i] + overhead
        for g in groups:
            before = padded_pairs([q_lens[j] for j in g], [kv_lens[j] for j in g])
            after = padded_pairs([q_lens[j] for j in g] + [q_lens[i]], [kv_lens[j] for j in g] + [kv_lens[i]])
            if after - before < best_cost:
                best, best_cost = g, after - before
        if best is None:
            groups.append([i])
        else:
            best.append(i)
    return sorted(sorted(g) for g in groups)


@dataclass(frozen=True)
class PaddedGroup:
    shape: tuple[int, int, int]  # (b, max_q, max_kv)
    gather: torch.Tensor  # [b * max_kv] cache slots, flat: index_select on it is several times faster than k[gather]
    # [b, 1, max_q, max_kv], bool (additive when folded); None when every query sees every key
    mask: torch.Tensor | None
    causal: bool
    q_rows: torch.Tensor | None  # rows of the padded [b * max_q] queries that are real; None: all
    tokens: torch.Tensor | None  # this group's rows of the forward's tokens; None: all, in order
    folded: bool  # query heads sharing a KV head folded into the query length (see above)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as SDPA's additive one (0 where seen, -inf where not), made once per forward:
    given the boolean mask, SDPA converts it in every layer's call; outputs are bit-identical
    (evidence: docs/architecture.md#the-model-runtime)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def plan_group(meta: AttentionMetadata, members: list[int], token_starts: list[int], whole: bool, fold: int,
               dtype: torch.dtype = torch.float32) -> PaddedGroup:
    """fold: query heads per KV head to fold into the query length, or 1 for none; dtype: the cache's."""
    device = meta.kv_indices.device
    page = meta.page_size
    q_lens = [meta.q_lens[i] for i in members]
    kv_lens = [meta.kv_lens[i] for i in members]
    b, max_q, max_kv = len(members), max(q_lens), max(kv_lens)
    gather = torch.zeros(b, max_kv, dtype=torch.long, device=device)
    mask = torch.zeros(b, 1, max_q, max_kv, dtype=torch.bool, device=device)
    # Padded query rows must see at least one key, or SDPA returns NaN for them.
    mask[:, :, :, 0] = True
    offsets = torch.arange(max_kv, device=device)
    indptr = meta.kv_indptr.tolist()
    rows, tokens = [], []
    for j, i in enumerate(members):
        q_len, kv_len = meta.q_lens[i], meta.kv_lens[i]
        blocks = meta.kv_indices[indptr[i] : indptr[i + 1]].to(torch.long)
        pos = offsets[:kv_len]
        gather[j, :kv_len] = blocks[pos // page] * page + pos % page
        mask[j, 0, :q_len, :kv_len] = meta.masks[i]
        rows.append(torch.arange(q_len, device=device) + j * max_q)
        if not whole:
            tokens.append(torch.arange(q_len, device=device) + token_starts[i])
    # Hand SDPA the simplest problem that is equivalent, as transformers does: no mask when every
    # query sees every key (decode over equal lengths), is_causal for a fresh causal prefill. Its
    # kernels then round exactly as transformers' own calls do, and skip the mask reads.
    causal = b == 1 and max_q == max_kv and torch.equal(mask[0, 0], torch.ones_like(mask[0, 0]).tril_())
    folded = fold > 1 and not causal
    mask = None if causal or bool(mask.all()) else mask
    return PaddedGroup(
        shape=(b, max_q, max_kv),
        gather=gather.view(-1),
        mask=additive(mask.repeat(1, 1, fold, 1), dtype) if folded and mask is not None else mask,
        causal=causal,
        # A decode batch (one token each) or a single sequence has no padded query rows to scatter
        # into and pick back out.
        q_rows=None if all(q == max_q for q in q_lens) else torch.cat(rows),
        tokens=None if whole else torch.cat(tokens),
        folded=folded,
    )


class TorchSDPABackend:
    cuda_graphs = False

    def __init__(self, kv_cache: KVCache, num_heads: int) -> None:
        self.cache = kv_cache
        self.heads_per_kv_head = num_heads // kv_cache.data.shape[-2]
        self.meta: AttentionMetadata | None = None
        self.groups: list[PaddedGroup] = []

    def plan(self, meta: AttentionMetadata) -> None:
        starts = [0]
        for q_len in meta.q_lens:
            starts.append(starts[-1] + q_len)
        partition = group_sequences(meta.q_lens, meta.kv_lens, GROUP_OVERHEAD_PAIRS)
        whole = len(partition) == 1
        dtype = self.cache.data.dtype
        fold = 1 if dtype == torch.float32 else self.heads_per_kv_head
        self.meta = meta
        self.groups = [plan_group(meta, g, starts, whole, fold, dtype) for g in partition]

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.meta is not None, "plan() must run before forward()"
        k_flat, v_flat = self.cache.write(layer, self.meta.slot_mapping, k, v)
        if len(self.groups) == 1 and self.groups[0].tokens is None:
            return self._attend(self.groups[0], q, k_flat, v_flat)
        out = torch.empty_like(q)
        for g in self.groups:
            out.index_copy_(0, g.tokens, self._attend(g, q.index_select(0, g.tokens), k_flat, v_flat))
        return out

    @staticmethod
    def _attend(g: PaddedGroup, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor) -> torch.Tensor:
        b, max_q, max_kv = g.shape
        heads, dim = q.shape[1], q.shape[2]
        if g.q_rows is not None:
            q = q.new_zeros(b * max_q, heads, dim).index_copy_(0, g.q_rows, q)
        q = q.view(b, max_q, heads, dim).transpose(1, 2)
        kv_heads = k_flat.shape[1]
        keys = k_flat.index_select(0, g.gather).view(b, max_kv, kv_heads, dim).transpose(1, 2)
        values = v_flat.index_select(0, g.gather).view(b, max_kv, kv_heads, dim).transpose(1, 2)
        if g.folded:
            q = q.reshape(b, kv_heads, heads // kv_heads * max_q, dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=g.mask).view(b, heads, max_q, dim)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=g.mask, is_causal=g.causal, enable_gqa=True)
        out = out.transpose(1, 2).reshape(b * max_q, heads, dim)
        return out if g.q_rows is None else out.index_select(0, g.q_rows)
