"""Prefill pacing: how many prompt tokens an iteration carries beside the decoding requests (as far as
their slack pays for, never below what first-token deadlines need) and how they are split among the
prefilling requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .deadlines import urgent_chunk
from .slo_slack import planned_remaining, seq_ends_within_slo, seq_slack_s

if TYPE_CHECKING:
    from ..sequence import Sequence
    from .prefill_estimator import Estimator


# chunk_within_tpot aims at this share of the tightest target: the chunk's cost is a prediction, and
# iterations planned at the target itself ran past it about every third time
# (docs/scheduling.md#chunked-prefill-and-pacing)
WITHIN_TPOT_SHARE = 0.8


def paced_chunk(allowance_ms: float, extra_ms: Callable[[int], float], cap: int) -> int:
    """The largest prefill chunk c <= cap whose extra iteration time `extra_ms(c)` (non-decreasing)
    fits the allowance: prefill rides along decode only as far as the decoding requests' slack goes."""
    if allowance_ms < 0:
        return 0
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if extra_ms(mid) <= allowance_ms:
            lo = mid
        else:
            hi = mid - 1
    return lo


def split_chunks(prefill: list[Sequence], cap: int) -> dict[Sequence, int]:
    """Up to `cap` prefill tokens, to the requests in order, each as far as its prompt goes."""
    chunks: dict[Sequence, int] = {}
    for seq in prefill:
        n = min(seq.prefill_goal - seq.prefilled, cap)
        if n <= 0:
            break
        chunks[seq] = n
        cap -= n
    return chunks


def prefill_budget(prefill: list[Sequence], decode: list[Sequence], depth: int, width: int, now: float,
                   est: Estimator, full: int, spare_decodes: bool = False, eager: bool = False,
                   within_tpot: bool = False) -> int:
    """`within_tpot`: the chunk that pacing gives is cut to what keeps the iteration within the tightest
    TPOT target among the decoding requests (chunk_within_tpot), never below what first-token
    deadlines need."""
    budget = _prefill_budget(prefill, decode, depth, width, now, est, full, spare_decodes, eager)
    if not within_tpot or not decode:
        return budget
    urgent = deadlines_floor(prefill, len(decode), now, est, full)
    return max(min(budget, chunk_within_tpot(decode, depth, width, est, full)), urgent)


def deadlines_floor(prefill: list[Sequence], n_decode: int, now: float, est: Estimator, full: int) -> int:
    """What first-token deadlines need this iteration (urgent_chunk), each chunk priced beside `n_decode`
    decoding requests, at most `full`."""
    return min(urgent_chunk(prefill, now, lambda chunk: est.prefill_iteration_s(n_decode, chunk), full), full)


def chunk_within_tpot(decode: list[Sequence], depth: int, width: int, est: Estimator, cap: int) -> int:
    """The largest chunk with which the iteration takes no longer than the tightest TPOT target among
    the decoding requests. Pacing alone lets a chunk spend a request's accumulated slack in one long
    iteration: its mean TPOT holds, but its stream stops for that iteration, and a reader (or a
    client measuring inter-token latency) sees a stall many times the pace it asked for."""
    targets_ms = [s.slo.tpot_ms for s in decode if s.slo.tpot_ms is not None]
    if not targets_ms:
        return cap
    n = len(decode)
    allowance_ms = WITHIN_TPOT_SHARE * min(targets_ms) - est.iteration_s(n, depth, width) * 1e3
    return paced_chunk(allowance_ms, lambda chunk: est.chunk_extra_ms(n, depth, chunk), cap)


def _prefill_budget(prefill: list[Sequence], decode: list[Sequence], depth: int, width: int, now: float,
                    est: Estimator, full: int, spare_decodes: bool, eager: bool) -> int:
    """SLO-aware prefill's tokens this iteration: the chunk paced by the decoding requests' slack
    (paced_prefill) but never below what the first-token deadlines need (urgent_chunk); with
    `spare_decodes`, that floor only as far as no decoding request is pushed past its target
    (spared_prefill). With none decoding, `full`. First tokens take it in deadline order (edf_key).
    `eager`: at least spared_prefill whatever the deadlines need (first tokens early, not just in time)."""
    if not decode:
        return full
    if eager:
        paced = paced_prefill(decode, depth, width, now, est, full)
        return max(paced, spared_prefill(decode, depth, width, now, est, full))
    urgent = deadlines_floor(prefill, len(decode), now, est, full)
    if spare_decodes:
        urgent = min(urgent, spared_prefill(decode, depth, width, now, est, full))
    return max(paced_prefill(decode, depth, width, now, est, full), urgent)


def paced_prefill(decode: list[Sequence], depth: int, width: int, now: float, est: Estimator, cap: int,
                  catch_up: bool = False) -> int:
    """The chunk the least slack among decoding requests that can still make their SLOs pays for.
    With `catch_up` (spared_prefill), each request's slack plus what its remaining tokens win back at
    this load's time per token."""
    n = len(decode)
    t_iter, best, tpot = est.iteration_s(n, depth, width), est.tpot_at(1), est.tpot_at(n) if catch_up else 0.0
    allowances = []
    for s in decode:
        slack = seq_slack_s(s, now, t_iter)
        if seq_ends_within_slo(s, slack, best):
            won_back = max(planned_remaining(s, tpot), 0) * (s.planned_tpot_s - tpot) if catch_up else 0.0
            allowances.append(slack + won_back)
    if not allowances:
        return cap
    return paced_chunk(min(allowances) * 1e3, lambda chunk: est.chunk_extra_ms(n, depth, chunk), cap)


def spared_prefill(decode: list[Sequence], depth: int, width: int, now: float, est: Estimator, cap: int) -> int:
    """The largest chunk after which every decoding request that can still make its SLO still ends
    within it at this load's time per token: a first token may take a decoding request's slack and
    what its remaining tokens win back, not more. Otherwise a burst's prompts stall a request with few
    tokens left for a few hundred ms, and it ends far over its target (one late first token is
    traded for several missed TPOTs)."""
    return paced_prefill(decode, depth, width, now, est, cap, catch_up=True)
