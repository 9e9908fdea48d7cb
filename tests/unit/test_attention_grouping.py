"""How the torch attention backend splits a batch into padded groups (no model; the numerics of every
grouping are checked against transformers in test_model_runtime.py)."""

from __future__ import annotations

from adaserve_backend.attention.torch_sdpa import GROUP_OVERHEAD_PAIRS, group_sequences, padded_pairs


def test_a_decode_batch_stays_one_group():
    assert group_sequences([1] * 8, [120, 300, 450, 80, 500, 260, 90, 410], GROUP_OVERHEAD_PAIRS) == [list(range(8))]


def test_trees_of_similar_size_stay_together():
    assert group_sequences([7, 5, 9, 6], [300, 400, 350, 420], GROUP_OVERHEAD_PAIRS) == [[0, 1, 2, 3]]


def test_a_prefill_chunk_gets_its_own_group_beside_decode_trees():
    q = [6] * 8 + [64]
    kv = [500, 420, 380, 300, 450, 260, 510, 330, 64]
    groups = group_sequences(q, kv, GROUP_OVERHEAD_PAIRS)
    assert groups == [list(range(8)), [8]]
    split = sum(padded_pairs([q[i] for i in g], [kv[i] for i in g]) for g in groups)
    assert split + GROUP_OVERHEAD_PAIRS < padded_pairs(q, kv) / 3


def test_small_shape_differences_are_not_worth_a_call():
    assert group_sequences([2, 1], [40, 30], GROUP_OVERHEAD_PAIRS) == [[0, 1]]


def test_free_calls_put_every_sequence_apart_and_groups_cover_each_once():
    q, kv = [3, 1, 12, 1, 5], [30, 10, 12, 50, 9]
    assert group_sequences(q, kv, -(10**9)) == [[0], [1], [2], [3], [4]]
    for overhead in (0, 100, GROUP_OVERHEAD_PAIRS, 10**9):
        groups = group_sequences(q, kv, overhead)
        assert sorted(i for g in groups for i in g) == list(range(len(q)))
        assert all(g == sorted(g) for g in groups)
