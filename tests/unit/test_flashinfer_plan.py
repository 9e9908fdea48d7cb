"""FlashInfer plan inputs (attention/flashinfer_plan.py) checked on the CPU: the mask packing against
numpy's little-endian packbits and back; the plan's fields on a hand-built batch; and the torch reference
of the kernel (attention/paged_reference.py), reading nothing but the plan and the NHD pages, against our
torch backend on the same cache and queries: decode steps, fresh and chunked prefill, token trees, tree
tails computed over a region drafted earlier, pages of 1 to 16 slots, GQA."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from adaserve_backend.attention.flashinfer_plan import (
    build_plan,
    pack_segments,
    unpack_segment,
    unpack_segments,
)
from adaserve_backend.attention.metadata import build_metadata
from adaserve_backend.attention.paged_reference import paged_attention
from adaserve_backend.attention.torch_sdpa import TorchSDPABackend
from adaserve_backend.kv_cache import BlockManager, KVCache

DIM = 16


def test_packing_is_numpys_little_bit_order_per_segment_and_round_trips():
    assert pack_segments(torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool), [8])[0].tolist() == [0b11001101]
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 7, 8, 9, 15, 16, 17, 64, 100, 3]
    bits = torch.rand(sum(lengths), generator=gen) < 0.5
    packed, offsets = pack_segments(bits, lengths)
    assert packed.dtype == torch.uint8 and offsets.dtype == torch.int32
    assert offsets.diff().tolist() == [-(-n // 8) for n in lengths]  # each segment on whole bytes
    start = 0
    for i, n in enumerate(lengths):
        segment = bits[start : start + n]
        want = np.packbits(segment.numpy(), bitorder="little")
        assert packed[offsets[i] : offsets[i + 1]].numpy().tolist() == want.tolist()
        assert torch.equal(unpack_segment(packed, int(offsets[i]), n), segment)
        start += n
    assert torch.equal(unpack_segments(packed, offsets, lengths), bits)
    with pytest.raises(ValueError):
        pack_segments(bits, lengths[:-1])


def test_plan_fields_on_a_hand_built_batch():
    blocks = BlockManager(64, 4)
    blocks.append(0, [-1] + list(range(7)))  # 8 committed: the decode token opens a third page
    blocks.commit_all(0)
    blocks.append(0, [-1])
    blocks.append(1, [-1, 0, 1])
    blocks.commit_all(1)
    blocks.append(1, [-1, 0, 0, 1, -1])  # a tree of 5 fills its second page exactly
    meta = build_metadata(blocks, [(0, 1), (1, 5)], "cpu")
    plan = build_plan(meta)
    assert plan.qo_indptr.tolist() == [0, 1, 6]
    assert plan.paged_kv_indptr.tolist() == [0, 3, 5] == meta.kv_indptr.tolist()
    assert plan.paged_kv_indices.tolist() == list(blocks.table(0)[:3]) + list(blocks.table(1)[:2])
    assert plan.paged_kv_last_page_len.tolist() == [1, 4]
    assert all(t.dtype == torch.int32 for t in (plan.qo_indptr, plan.paged_kv_indptr, plan.paged_kv_indices,
                                                 plan.paged_kv_last_page_len, plan.mask_indptr))
    assert not plan.causal and not plan.decode_only
    # FlashInfer's own mask offsets count q_len * kv_len bits per request, kv_len from the pages
    pages = plan.paged_kv_indptr.diff()
    kv_lens = (pages - 1) * 4 + plan.paged_kv_last_page_len
    assert kv_lens.tolist() == [9, 8]
    assert plan.mask_indptr.tolist() == [0, 2, 7]  # ceil(1 * 9 / 8), ceil(5 * 8 / 8)
    flat = torch.cat([m.reshape(-1) for m in meta.masks])
    assert torch.equal(plan.custom_mask, flat)
    assert torch.equal(unpack_segments(plan.packed_custom_mask, plan.mask_indptr, [9, 40]), flat)


def random_tree(rng: random.Random, n: int, base: int = 0) -> list[int]:
    """Parents for n tokens appended after a region of `base` tokens (a forest: -1 hangs off the prefix)."""
    return [rng.randrange(-1, base + i) if rng.random() < 0.8 else -1 for i in range(n)]


def fill(blocks: BlockManager, rng: random.Random, seq: int, kind: str) -> int:
    """Sets sequence `seq` up as one kind of step; returns how many tokens at its region's end run now."""
    context = rng.choice([0, 1, 3, 8, 16, 17, 30]) if kind == "prefill" else rng.randrange(1, 40)
    if context:
        blocks.append(seq, [-1] + list(range(context - 1)))
        blocks.commit_all(seq)
    if kind == "decode":
        blocks.append(seq, [-1])
        return 1
    if kind == "prefill":  # a fresh prompt (context 0) or a chunk continuing one
        n = rng.randrange(1, 20)
        blocks.append(seq, [-1] + list(range(n - 1)))
        return n
    if kind == "tree":
        n = rng.randrange(2, 14)
        blocks.append(seq, random_tree(rng, n))
        return n
    # a draft beam step: a tree drafted earlier, its next tokens computed now over all of it
    drafted = rng.randrange(1, 10)
    blocks.append(seq, random_tree(rng, drafted))
    n = rng.randrange(1, 6)
    blocks.append(seq, random_tree(rng, n, drafted))
    return n


def attend_both(seed: int, kinds: list[str], page: int, heads: int, kv_heads: int, causal: bool | None = None):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    blocks = BlockManager(1024, page)
    cache = KVCache(2, kv_heads, DIM, 1024, page, torch.float32, "cpu")
    cache.data.normal_()  # the committed contexts' keys and values
    new = [(s, fill(blocks, rng, s, kind)) for s, kind in enumerate(kinds)]
    meta = build_metadata(blocks, new, "cpu")
    plan = build_plan(meta, causal)
    torch_backend = TorchSDPABackend(cache, heads)
    torch_backend.plan(meta)
    tokens = sum(n for _, n in new)
    for layer in range(2):
        q = torch.randn(tokens, heads, DIM)
        k, v = torch.randn(tokens, kv_heads, DIM), torch.randn(tokens, kv_heads, DIM)
        want = torch_backend.forward(layer, q, k, v)  # writes this forward's K and V into the pages
        got = paged_attention(plan, q, *cache.layer(layer))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return plan


@pytest.mark.parametrize("seed", range(8))
def test_reference_over_the_plan_matches_the_torch_backend(seed):
    rng = random.Random(1000 + seed)
    kinds = [rng.choice(["decode", "prefill", "tree", "beam"]) for _ in range(rng.randrange(1, 6))]
    heads, kv_heads = rng.choice([(4, 4), (8, 2), (6, 1)])
    plan = attend_both(seed, kinds, rng.choice([1, 4, 16]), heads, kv_heads)
    if plan.custom_mask is not None:
        lengths = [q * k for q, k in zip(plan.q_lens, plan.kv_lens)]
        assert torch.equal(unpack_segments(plan.packed_custom_mask, plan.mask_indptr, lengths), plan.custom_mask)


@pytest.mark.parametrize("page", [1, 4, 16])
def test_every_kind_together_with_gqa(page):
    plan = attend_both(7, ["decode", "prefill", "tree", "beam", "tree", "decode"], page, 8, 2)
    assert not plan.causal


def test_chain_batches_plan_causal_without_a_mask_and_match_a_forced_mask():
    kinds = ["prefill", "decode", "prefill", "decode"]
    plan = attend_both(3, kinds, 4, 8, 2)
    assert plan.causal and plan.packed_custom_mask is None and plan.mask_indptr is None
    forced = attend_both(3, kinds, 4, 8, 2, causal=False)  # the same batch through mask bits
    assert not forced.causal
    decode = attend_both(4, ["decode"] * 5, 16, 6, 1)
    assert decode.decode_only
