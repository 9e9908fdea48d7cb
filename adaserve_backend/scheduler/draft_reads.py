"""What the draft reads of a request's tokens each iteration: the span it lacks, whether the request
drafts now, and how much of a lagging chain it catches up on. The scheduler decides this (capacity.py
reserves the draft cache for it); the draft worker and the simulator's replica read the same rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sequence import Sequence


def draft_chain_span(seq: Sequence, target_committed: int, draft_committed: int) -> tuple[int, int]:
    """The tokens the draft reads next, as [start, end) of seq.tokens: those it lacks up to one past the
    target's cache (for a decoding request, up to the root). It trails a prefilling request by one
    chunk, since it reads the features the target computed for that chunk."""
    return draft_committed, min(len(seq.tokens), target_committed + 1)


# The draft reads lazily. An iteration that decodes without speculating runs no draft at all, its
# prefill chunks included: at loads where speculation does not pay, reading every chunk and every
# accepted token cost a draft forward per iteration for nothing (each prefill iteration paid a draft
# pass, and each exploration first read every request's skipped tokens; docs/architecture.md#the-model-runtime). What it
# skipped, the draft reads when speculation resumes: at most DRAFT_CATCH_UP tokens of a decoding
# request per speculative iteration, and a decoding request drafts only once it lags at most
# DRAFT_MAX_LAG tokens (meanwhile it decodes plain), so resuming costs no iteration much more.
# An iteration with no decoding request reads its chunks (a lone request's draft is ready at once).
DRAFT_CATCH_UP = 64
DRAFT_MAX_LAG = 24


def drafts_now(chain_len: int, decoding: bool, depth: int) -> bool:
    """Whether a request the draft lags `chain_len` tokens behind drafts a tree this iteration."""
    return depth > 0 and decoding and chain_len <= DRAFT_MAX_LAG


def draft_reads(chain_len: int, decoding: bool, depth: int, any_decoding: bool) -> int:
    """How many of its chain tokens the draft reads this iteration, before any beams: all of a request
    that drafts; a prefill chunk's chain whole, unless the iteration decodes without speculating; up to
    DRAFT_CATCH_UP of a decoding request catching up, never its root (that is read when it drafts)."""
    if drafts_now(chain_len, decoding, depth) or not any_decoding:
        return chain_len
    if depth == 0:
        return 0
    return min(chain_len - 1, DRAFT_CATCH_UP) if decoding else chain_len
