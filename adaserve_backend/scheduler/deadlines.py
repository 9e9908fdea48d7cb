"""First-token deadlines: the order waiting and prefilling requests are served in, the smallest prefill
chunk that keeps them on time, and the overload answer. A request's first token is due at arrival + its
TTFT target; after it, the paper's TPOT constraint takes over (slo_slack.py).

Pure functions over sequences and the estimator's predictions, so the scheduler stays about queues.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sequence import Sequence
    from .prefill_estimator import Estimator


# Why admission gave up a request's first-token deadline (rejections by reason in the metrics).
UNREACHABLE = "deadline_unreachable"  # even starting now its first token would be late
NO_CAPACITY = "no_capacity_in_time"  # it could not start in time without putting running requests off their TPOT


def edf_key(seq: Sequence) -> tuple[int, float, float]:
    """Earliest deadline first, each deadline pushed back by the request's own prefill time: of two
    requests due about together the shorter prompt goes first (its prefill delays the other less than
    the other's delays it, and a burst's order no longer depends on which arrived a millisecond
    first), while one due earlier by more than the difference of their prefill times still goes first.
    A request that has streamed (preempted, re-prefilling) goes before any that has not: its client is
    mid-stream and every token of it is already due. While arrival order keeps every deadline
    (order_by_arrival), a request with a deadline is keyed by its arrival instead."""
    at = seq.arrival if seq.by_arrival else seq.deadline + seq.prefill_s
    return (0 if seq.started_stream else 1, at, seq.arrival)


def arrival_order_on_time(waiting: Iterable[Sequence], prefilling: list[Sequence], est: Estimator, now: float,
                          n_decode: int, chunk: int, within: float = 1.0) -> bool:
    """Whether first tokens served in arrival order all come within `within` of their time to their
    deadlines, the running prefills' whole prompts still ahead and the waiting requests starting only
    after the next iteration: a request that arrival order keeps waiting one more iteration must not
    become late for it (missed, after_next), where deadline order would have served it in time."""
    start = now + next_iteration_s(est, n_decode, chunk, bool(prefilling))
    through = sum(prefill_left(s) for s in prefilling if s.started_stream)  # these go first either way
    for seq in sorted([s for s in [*prefilling, *waiting] if has_deadline(s)], key=lambda s: s.arrival):
        through += prefill_left(seq)
        if start + est.first_token_s(n_decode, through, chunk) > seq.arrival + within * (seq.deadline - seq.arrival):
            return False
    return True


def order_by_arrival(waiting: Iterable[Sequence], prefilling: list[Sequence], on: bool) -> None:
    """Key the requests with a deadline by arrival (edf_key) if `on`, else by deadline."""
    for seq in [*waiting, *prefilling]:
        seq.by_arrival = on and has_deadline(seq)


def next_iteration_s(est: Estimator, n_decode: int, chunk: int, prefilling: bool) -> float:
    """The next iteration: one carrying a prefill chunk if any prompt is prefilling, else a decode
    iteration, else none."""
    if prefilling:
        return est.prefill_iteration_s(n_decode, chunk)
    return est.iteration_s(n_decode, *est.depth_width(n_decode)) if n_decode else 0.0


def note_prefill_times(waiting: Iterable[Sequence], est: Estimator, chunk: int) -> None:
    """Each waiting request's own prefill alone, what the caches hold for it skipped (edf_key)."""
    for seq in waiting:
        seq.prefill_s = est.first_token_s(0, prefill_left(seq), chunk)


def has_deadline(seq: Sequence) -> bool:
    """Whether its first-token deadline still governs it: not yet streaming, not already given up."""
    return not seq.started_stream and not seq.slo_missed and math.isfinite(seq.deadline)


def prefill_left(seq: Sequence) -> int:
    """Prompt tokens still to compute: a waiting request skips what the prefix cache holds for it."""
    return seq.prefill_goal - max(seq.prefilled, seq.cached_prefix)


def first_token_at(est: Estimator, seq: Sequence, start: float, n_decode: int, ahead: int, chunk: int,
                   behind: int = 0) -> float:
    """When `seq`'s first token comes if its prefill starts at `start` behind `ahead` prefill tokens,
    `chunk` tokens per iteration beside `n_decode` decoding requests, `behind` tokens of later prompts
    filling its last iteration."""
    return start + est.first_token_s(n_decode, ahead + prefill_left(seq), chunk, behind)


def running_first_token_at(est: Estimator, seq: Sequence, start: float, n_decode: int, prefilling: list[Sequence],
                           chunk: int) -> float:
    """`first_token_at` for `seq` prefilling among `prefilling` (itself included or not). Later prompts
    fill its last iteration only with none decoding: beside decodes, pacing cuts chunks below `chunk`,
    and counting them overpriced that iteration
    (docs/scheduling.md#the-estimator-decode_estimatorpy-prefill_estimatorpy)."""
    others = [s for s in prefilling if s is not seq]
    behind = tokens_behind(seq, others) if n_decode == 0 else 0
    return first_token_at(est, seq, start, n_decode, tokens_ahead(seq, others), chunk, behind)


def predict_first_tokens(started: list[Sequence], n_decode: int, prefilling: list[Sequence], now: float,
                         est: Estimator, chunk: int) -> None:
    """Each starting request's first token as expected now (Sequence.predicted_first_token), those
    admitted after it in the same step sharing its last chunk, every iteration carrying `chunk` prefill
    tokens: the step's budget, not the cap, since beside decodes pacing gives a prompt fewer and pricing
    them at the cap put long prompts' first tokens early
    (docs/scheduling.md#the-estimator-decode_estimatorpy-prefill_estimatorpy)."""
    for seq in [s for s in started if s.first_token_time is None]:
        seq.predicted_first_token = running_first_token_at(est, seq, now, n_decode, prefilling, chunk)


def tokens_ahead(seq: Sequence, prefilling: Iterable[Sequence]) -> int:
    """Prefill tokens of running requests served before `seq` (EDF, see prefill_order)."""
    key = edf_key(seq)
    return sum(prefill_left(s) for s in prefilling if edf_key(s) <= key)


def tokens_behind(seq: Sequence, prefilling: Iterable[Sequence]) -> int:
    """Prefill tokens of running requests served after `seq`: chunks are packed in EDF order, so the
    first of them share its last iteration."""
    key = edf_key(seq)
    return sum(prefill_left(s) for s in prefilling if edf_key(s) > key)


def urgent_chunk(prefilling: list[Sequence], now: float, iteration_s: Callable[[int], float], cap: int) -> int:
    """The smallest per-iteration prefill chunk c <= cap with which every prefilling request (in EDF
    order) that still has a deadline completes its prompt before it, iterations carrying c taking
    `iteration_s(c)`; where even `cap` is not enough, what is needed at that chunk's iteration time
    (more than `cap`). Prefill pacing protects the decoding requests' TPOT; this is the floor under it
    that protects first tokens. Priced at the chunk it asks for, not at a full one: a full chunk's long
    iterations fit few times before a deadline, so asking for it at that price left the prompts alone
    until the last iterations and then carried them whole, stalling every stream for a full chunk's
    time; priced at what it asks, the need spreads over the iterations before the deadline."""
    at_cap = _deadlines_need(prefilling, now, iteration_s(cap))
    if at_cap > cap:
        return at_cap
    lo, hi = 0, cap  # c / iteration_s(c) grows with c: the smallest c that suffices
    while lo < hi:
        mid = (lo + hi) // 2
        if _deadlines_need(prefilling, now, iteration_s(mid)) <= mid:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _deadlines_need(prefilling: list[Sequence], now: float, t_iter_s: float) -> int:
    """The per-iteration chunk the deadlines need, iterations taking `t_iter_s`."""
    need, through = 0, 0
    for seq in sorted(prefilling, key=edf_key):
        through += prefill_left(seq)
        if has_deadline(seq):
            iterations = max(1, math.floor((seq.deadline - now) / t_iter_s)) if t_iter_s > 0 else 1
            need = max(need, math.ceil(through / iterations))
    return need


def rejection_message(seq: Sequence, first_token: float) -> str:
    return (f"server cannot meet ttft_slo_ms={seq.slo.ttft_ms:g} at the current load "
            f"(predicted first token in {(first_token - seq.arrival) * 1e3:.0f} ms)")


def missed_at(waiting: Iterable[Sequence], est: Estimator, start: float, n_decode: int, prefilling: list[Sequence],
              chunk: int, done: int = 0) -> list[tuple[Sequence, float]]:
    """The waiting requests with a deadline whose first token, if their prefill started at `start`
    behind the running prefills due before them (less `done` tokens of those), would be late; each
    with that predicted time."""
    late = []
    for seq in [s for s in waiting if has_deadline(s)]:
        at = first_token_at(est, seq, start, n_decode, max(0, tokens_ahead(seq, prefilling) - done), chunk)
        if at > seq.deadline:
            late.append((seq, at))
    return late


def missed(waiting: Iterable[Sequence], est: Estimator, now: float, n_decode: int,
           prefilling: list[Sequence], chunk: int,
           after_next: bool = False) -> list[tuple[Sequence, float]]:
    """missed_at for requests that start now, or (`after_next`) no sooner than after the next
    iteration: one carrying a chunk of the running prefills if any (`chunk` of their tokens done by
    then), else a decode iteration."""
    start, done = now, 0
    if after_next:
        start, done = now + next_iteration_s(est, n_decode, chunk, bool(prefilling)), chunk if prefilling else 0
    return missed_at(waiting, est, start, n_decode, prefilling, chunk, done)


def deferred_in_burst(waiting: Iterable[Sequence], est: Estimator, now: float, n_decode: int,
                      prefilling: list[Sequence], chunk: int) -> set[Sequence]:
    """The waiting requests to hold back so that as many first tokens as possible come in time, when
    not all can: Moore-Hodgson over the prefill work. Walk the running prefills and the waiting
    requests in EDF order (edf_key); whenever one's first token would be late, set aside the waiting
    request with the longest prefill among those walked so far, and go on. A burst then costs the few
    long prompts that would have made many short ones late, not every request due after the point
    where the queue fell behind. Running prefills are never set aside (their work is under way);
    a held-back request still starts if capacity frees in time, and is refused once its own first
    token would be late (missed)."""
    waiting = [s for s in waiting if has_deadline(s)]
    candidates = set(waiting)
    walked: list[Sequence] = []
    deferred: set[Sequence] = set()
    through = 0
    for seq in sorted([*prefilling, *waiting], key=edf_key):
        walked.append(seq)
        through += prefill_left(seq)
        while has_deadline(seq) and now + est.first_token_s(n_decode, through, chunk) > seq.deadline:
            movable = [s for s in walked if s in candidates and s not in deferred]
            if not movable:
                break
            longest = max(movable, key=prefill_left)
            deferred.add(longest)
            through -= prefill_left(longest)
            if longest is seq:
                break
    return deferred
