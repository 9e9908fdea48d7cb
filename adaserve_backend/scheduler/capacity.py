"""KV capacity of one iteration, as pure bookkeeping over the block managers: every request's worst-case
appends to the target cache and, when speculating, the draft cache; whether they fit the free blocks,
and taking them. The scheduler decides what to do when they do not (preempt, stop speculating, fail a
lone request); `fit_iteration` applies the order it decides in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..kv_cache import BlockManager
from ..sequence import Sequence
from .draft_reads import draft_chain_span, draft_reads, drafts_now

Needs = dict[Sequence, int]  # tokens each request may append to one cache this iteration


def iteration_needs(target: BlockManager, draft: BlockManager | None, decode: list[Sequence],
                    prefill: dict[Sequence, int], depth: int, width: int,
                    lookup_tokens: int = 0) -> tuple[Needs, Needs | None]:
    """Worst case, per cache: each decoding request's whole tree is appended to the target cache
    (acceptance is known only after the forward), with copied chains of `lookup_tokens` in all beside
    the beams (speculation/lookup.py: never read by the draft); the draft appends what it reads of its
    chain (draft_reads.py), then, for a request that drafts, d-1 levels of w beams."""
    tree = 1 + depth * width + lookup_tokens
    target_needs = {**{s: tree for s in decode}, **prefill}
    if draft is None:
        return target_needs, None
    reads = {}
    for s in decode:
        n = draft_chain_len(target, draft, s)
        reads[s] = draft_reads(n, True, depth, True) + (depth * width if drafts_now(n, True, depth) else 0)
    chunks = {s: draft_reads(draft_chain_len(target, draft, s), False, depth, bool(decode)) for s in prefill}
    return target_needs, {**reads, **chunks}


def fits(blocks: BlockManager | None, needs: Needs | None) -> bool:
    """Whether appending `n` tokens to each sequence fits the free blocks (no cache: nothing to fit)."""
    if blocks is None or needs is None:
        return True
    need = sum(blocks.extra_blocks_needed(s.seq_id, n) for s, n in needs.items())
    return need <= blocks.num_free_blocks


def reserve(blocks: BlockManager | None, needs: Needs | None) -> None:
    """Take the blocks `needs` may fill (after `fits` said they are free)."""
    for s, n in (needs or {}).items():
        blocks.reserve(s.seq_id, n)


def draft_chain_len(target: BlockManager, draft: BlockManager, seq: Sequence) -> int:
    """How many tokens the draft reads before drafting (see draft_reads.draft_chain_span)."""
    start, end = draft_chain_span(seq, target.num_committed(seq.seq_id), draft.num_committed(seq.seq_id))
    return max(end - start, 0)



@dataclass
class Fit:
    """What one iteration runs once its worst-case KV needs are reserved."""

    decode: list[Sequence]
    depth: int
    width: int
    copies: bool  # whether trees may take the suffix index's copied chains


def fit_iteration(target: BlockManager, draft: BlockManager | None, running: list[Sequence],
                  decode: list[Sequence], chunks: dict[Sequence, int], depth: int, width: int,
                  lookup_reserved: int, lookup_suffix_tokens: int, preempt_one: Callable[[], None]) -> Fit | None:
    """Reserve the iteration's worst case, shrinking it until it fits: `preempt_one` (which removes a
    request from `running`) while more than one request runs, then no speculation for a lone request.
    None: a lone request that does not fit even without speculation."""
    copies = bool(lookup_reserved and decode)  # the suffix index's proposals need no draft step
    while True:
        decode = [s for s in decode if s in running]
        prefill = {s: n for s, n in chunks.items() if s in running}
        copied = (lookup_reserved if depth else lookup_suffix_tokens) if copies else 0  # beside the beams
        needs, draft_needs = iteration_needs(target, draft, decode, prefill, depth, width, copied)
        if fits(target, needs) and fits(draft, draft_needs):
            reserve(target, needs)
            reserve(draft, draft_needs)
            return Fit(decode, depth, width, copies)
        if len(running) > 1:
            preempt_one()
        elif depth or copies:
            depth = width = 0
            copies = False
        else:
            return None
