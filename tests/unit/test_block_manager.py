"""KV block bookkeeping: no leaks, explicit out-of-capacity, path commit semantics."""

from __future__ import annotations

import random

import pytest
import torch

from adaserve_backend.attention import ancestor_mask
from adaserve_backend.kv_cache import BlockManager, KVCache, KVCacheFull, chain_parents


def owned_blocks(bm: BlockManager) -> list[int]:
    return [b for sid in list(bm._seqs) for b in bm.seq(sid).block_table]


def test_many_cycles_leak_nothing():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=64, block_size=4)
    live: set[int] = set()
    for step in range(3000):
        op = rng.random()
        if op < 0.45:  # append a chain or a tree to some sequence
            sid = rng.randrange(12)
            region = len(bm.seq(sid).region_parents) if bm.has(sid) else 0
            n = rng.randint(1, 9)
            parents = chain_parents(region,
                                    n) if rng.random() < 0.5 else [rng.randrange(-1, region + i) for i in range(n)]
            if bm.can_append(sid, n):
                bm.append(sid, parents)
                live.add(sid)
            else:
                with pytest.raises(KVCacheFull):
                    bm.append(sid, parents)
        elif op < 0.8 and live:  # commit a random root-to-node path of the region
            sid = rng.choice(sorted(live))
            parents = bm.seq(sid).region_parents
            path, node = [], rng.randrange(-1, len(parents)) if parents else -1
            while node >= 0:
                path.append(node)
                node = parents[node]
            before = bm.seq(sid).num_committed
            bm.commit(sid, path[::-1])
            assert bm.seq(sid).num_committed == before + len(path)
        elif live:
            sid = rng.choice(sorted(live))
            bm.free(sid)
            live.discard(sid)
        owned = owned_blocks(bm)
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert len(owned) + bm.num_free_blocks == bm.num_blocks
        for sid in live:
            s = bm.seq(sid)
            assert len(s.block_table) == bm.blocks_for(s.num_slots)
    for sid in list(live):
        bm.free(sid)
    assert bm.num_free_blocks == bm.num_blocks
    assert sorted(bm.pool._free) == list(range(64))


def test_full_cache_is_reported_and_state_untouched():
    bm = BlockManager(num_blocks=3, block_size=4)
    bm.append(0, chain_parents(0, 10))
    assert bm.num_free_blocks == 0
    assert bm.can_append(0, 2) and not bm.can_append(0, 3) and not bm.can_append(1, 1)
    with pytest.raises(KVCacheFull):
        bm.append(1, [-1])
    assert not bm.has(1) and bm.seq(0).num_slots == 10
    bm.commit(0, [])  # keep none of the region
    assert bm.num_free_blocks == 3 and bm.seq(0).num_slots == 0


def test_commit_moves_the_path_next_to_the_prefix_and_frees_the_rest():
    bm = BlockManager(num_blocks=8, block_size=2)
    bm.append(0, chain_parents(0, 3))
    bm.commit_all(0)
    # tree:    0 -> 1 -> 3 -> 5 ; 0 -> 2 -> 4 ; 1 -> 6
    bm.append(0, [-1, 0, 0, 1, 2, 3, 1])
    assert bm.seq(0).region_depths == [0, 1, 1, 2, 2, 3, 2]
    slots = [bm.slot(bm.seq(0), i) for i in range(10)]
    src, dst = bm.commit(0, [0, 1, 3, 5])
    # region index k sits at sequence index 3 + k; path indices 3, 5 move to 2, 3
    assert src == [slots[3 + 3], slots[3 + 5]] and dst == [slots[3 + 2], slots[3 + 3]]
    assert bm.seq(0).num_committed == 7 and len(bm.seq(0).block_table) == 4
    with pytest.raises(ValueError):
        bm.append(0, [3])  # parent must exist
    bm.append(0, [-1, 0])
    with pytest.raises(ValueError):
        bm.commit(0, [1])  # not a path from the prefix


def test_kv_move_copies_every_layer():
    kv = KVCache(num_layers=2, num_kv_heads=1, head_dim=2, num_blocks=2, block_size=2,
                 dtype=torch.float32, device="cpu")
    kv.data.copy_(torch.arange(kv.data.numel(), dtype=torch.float32).view_as(kv.data))
    before = kv.data.clone()
    kv.move([3, 2], [0, 3])
    for layer in range(2):
        for kind in range(2):
            k_flat = kv._flat[layer, kind]
            ref = before.view_as(kv._flat)[layer, kind]
            assert torch.equal(k_flat[0], ref[3]) and torch.equal(k_flat[3], ref[2])


def test_ancestor_mask_matches_brute_force():
    rng = random.Random(1)
    for _ in range(50):
        n = rng.randint(1, 12)
        parents = [rng.randrange(-1, i) for i in range(n)]
        mask = ancestor_mask(parents)
        for i in range(n):
            anc, node = set(), i
            while node >= 0:
                anc.add(node)
                node = parents[node]
            assert [bool(mask[i, j]) for j in range(n)] == [j in anc for j in range(n)]
