"""The prefill-only bound: the largest share of a level's requests whose first token a machine doing
nothing but prefill, at its peak rate R (prompt tokens per second), could deliver by each TTFT deadline
(arrival + TTFT target).

Decode work, speculation and every per-step overhead are ignored and the machine switches between
prompts at no cost (preemptive), so no real scheduler on that machine can put more first tokens on time:
an attainment near the bound means the scheduler lost little to its choices; a low bound means the
load itself was beyond the machine, whatever the scheduler did.

The schedule is preemptive earliest-deadline-first with release times (the arrivals), and requests are
given up Moore-Hodgson's way: take the jobs in deadline order; when the one just added would finish
late, drop the longest prefill (most prompt tokens) among the jobs that share its busy period (those
that delay it: released, and with deadlines up to its own), and repeat until it fits. With a common
release time this is Moore-Hodgson's algorithm and optimal; with release times it is a heuristic that
never exceeds the optimum (every set it keeps is EDF-feasible), checked against brute force in
tests/unit/test_prefill_bound.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

EPS_S = 1e-9  # float slack on a deadline: a prefill that ends exactly on it is on time


@dataclass(frozen=True)
class Job:
    release_s: float  # the request's arrival
    deadline_s: float  # arrival + TTFT target
    tokens: int  # prompt tokens to prefill before the first token


@dataclass(frozen=True)
class BoundResult:
    rate_tok_s: float
    total: int
    on_time: int
    dropped: tuple[int, ...]  # indices into the jobs given, ascending

    @property
    def share(self) -> float:
        """On-time share; 1.0 for no jobs (nothing to miss)."""
        return self.on_time / self.total if self.total else 1.0


def prefill_only_bound(jobs: Sequence[Job], rate_tok_s: float) -> BoundResult:
    """The share of `jobs` whose prefill, at `rate_tok_s`, ends by its deadline (module docstring)."""
    if rate_tok_s <= 0:
        raise ValueError(f"the prefill rate must be positive, got {rate_tok_s}")
    work = [j.tokens / rate_tok_s for j in jobs]
    release = [j.release_s for j in jobs]
    # A job late even alone is in no feasible set: dropping it first keeps it from costing others.
    hopeless = {i for i, j in enumerate(jobs) if j.release_s + work[i] > j.deadline_s + EPS_S}
    kept: list[int] = []  # a feasible set, kept sorted by release time
    dropped = set(hopeless)
    for i in sorted(set(range(len(jobs))) - hopeless, key=lambda i: (jobs[i].deadline_s, i)):
        bisect.insort(kept, i, key=lambda k: (jobs[k].release_s, k))
        # i has the latest deadline of the set, so EDF runs it last: the schedule of the others is
        # unchanged, and i ends when the busy period that holds its release does.
        while True:
            start, end, members = busy_period(kept, i, release, work)
            if end <= jobs[i].deadline_s + EPS_S:
                break
            # the longest in that busy period; on a tie the newest deadline (i itself) goes
            victim = max(members, key=lambda k: (jobs[k].tokens, jobs[k].deadline_s, k))
            kept.remove(victim)
            dropped.add(victim)
            if victim == i:
                break
    return BoundResult(rate_tok_s, len(jobs), len(jobs) - len(dropped), tuple(sorted(dropped)))


def busy_period(kept: list[int], i: int, release: Sequence[float],
                work: Sequence[float]) -> tuple[float, float, list[int]]:
    """The busy period of a work-conserving machine over `kept` (indices sorted by release) that holds
    item i's release: (start, end, its items). Busy periods do not depend on the order items run in,
    and an item released exactly when the machine falls idle starts a new one."""
    start = end = float("-inf")
    members: list[int] = []
    for k in kept:
        r = release[k]
        if r >= end:  # idle before r: a new busy period
            if r > release[i]:  # i's period has ended
                break
            start, end, members = r, r, []
        end += work[k]
        members.append(k)
    return start, end, members
