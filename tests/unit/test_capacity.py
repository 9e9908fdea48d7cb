"""scheduler/capacity.py: an iteration's worst-case KV appends against the free blocks, by hand."""

from __future__ import annotations

from adaserve_backend.kv_cache import BlockManager
from adaserve_backend.request import Request
from adaserve_backend.scheduler.capacity import draft_chain_len, fits, iteration_needs
from adaserve_backend.sequence import Sequence
from adaserve_backend.slo import SLO


def cached(blocks: BlockManager, seq_id: int, n: int) -> None:
    blocks.append(seq_id, [-1] + list(range(n - 1)))
    blocks.commit_all(seq_id)


def iteration_fits(target, draft, decode, prefill, depth, width, lookup_tokens=0) -> bool:
    """What the scheduler asks before reserving an iteration: both caches' worst cases fit."""
    t, d = iteration_needs(target, draft, decode, prefill, depth, width, lookup_tokens)
    return fits(target, t) and fits(draft, d)


def test_a_tree_fits_the_target_and_its_beams_the_draft_or_not():
    s = Sequence(Request("a", [5] * 7), 0, SLO(tpot_ms=100.0), 0.0, frozenset(), None, 7, output=[9], prefilled=7)
    target, draft = BlockManager(4, 4), BlockManager(3, 4)
    cached(target, s.seq_id, 8)  # prompt and first token: 2 blocks, 2 free
    cached(draft, s.seq_id, 6)  # two tokens behind: 2 blocks, 1 free
    assert draft_chain_len(target, draft, s) == 2
    # depth 2, width 2: a 5-token tree (13 slots, 4 blocks); the draft's chain and 4 beams (12, 3 blocks)
    assert iteration_fits(target, draft, [s], {}, 2, 2)
    # depth 3: the tree still fits (15 slots), the draft's 8 new tokens (14 slots, 4 blocks) do not
    assert not iteration_fits(target, draft, [s], {}, 3, 2)
    assert iteration_fits(target, None, [s], {}, 3, 2)
    # a copied chain beside the beams (prompt lookup) is reserved in the target only: 15 + 1 slots
    # still fit its 4 blocks, 15 + 2 do not; the draft never reads it
    assert iteration_fits(target, None, [s], {}, 3, 2, lookup_tokens=1)
    assert not iteration_fits(target, None, [s], {}, 3, 2, lookup_tokens=2)
    assert iteration_fits(target, draft, [s], {}, 2, 2, lookup_tokens=1)
    # a prefill chunk rides along: one decode token (a third block) and a new block of 4, not 2 of 5
    p = Sequence(Request("b", [5] * 8), 1, SLO(tpot_ms=100.0), 0.0, frozenset(), None, 8)
    assert iteration_fits(target, None, [s], {p: 4}, 0, 0) and not iteration_fits(target, None, [s], {p: 5}, 0, 0)
