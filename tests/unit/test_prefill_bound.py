"""The prefill-only bound (harness/prefill_bound.py): small examples worked by hand, and against brute
force over every subset, feasibility decided by an independent preemptive-EDF simulation (exact for
one preemptive machine)."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from harness.prefill_bound import BoundResult, Job, prefill_only_bound


def edf_on_time(jobs: list[Job], rate: float) -> bool:
    """Whether preemptive EDF (release times, one machine at `rate` tokens/s) ends every job by its
    deadline: an event simulation written apart from the module under test."""
    pending = sorted(jobs, key=lambda j: j.release_s)
    ready: list[tuple[float, int, float]] = []  # (deadline, tie, seconds left)
    t, k, tie = 0.0, 0, itertools.count()
    while k < len(pending) or ready:
        if not ready:
            t = max(t, pending[k].release_s)
        while k < len(pending) and pending[k].release_s <= t:
            j = pending[k]
            heapq.heappush(ready, (j.deadline_s, next(tie), j.tokens / rate))
            k += 1
        deadline, n, left = heapq.heappop(ready)
        until = pending[k].release_s if k < len(pending) else float("inf")
        if t + left <= until:  # finishes before the next release
            t += left
            if t > deadline + 1e-9:
                return False
        else:  # runs to the next release, then EDF chooses again
            heapq.heappush(ready, (deadline, n, left - (until - t)))
            t = until
    return True


def brute_force(jobs: list[Job], rate: float) -> int:
    """The most jobs of any subset that EDF puts all on time."""
    for size in range(len(jobs), 0, -1):
        if any(edf_on_time(list(s), rate) for s in itertools.combinations(jobs, size)):
            return size
    return 0


def test_moore_hodgson_gives_up_the_long_prefill_for_two_short_ones():
    # at 100 tok/s: A takes 10 s, B and C 1 s each, all arrive at 0. EDF keeps A, then B would end at 11
    # s (deadline 10.5): dropping A, already done by then, is what lets B and C both end in time.
    jobs = [Job(0.0, 10.0, 1000), Job(0.0, 10.5, 100), Job(0.0, 10.6, 100)]
    result = prefill_only_bound(jobs, 100.0)
    assert result == BoundResult(100.0, 3, 2, (0,))
    assert result.share == pytest.approx(2 / 3)


def test_a_later_arrival_with_an_earlier_deadline_preempts():
    # A (2 s of prefill, due at 2) runs from 0; B (0.5 s, due at 1.5) arrives at 1 and preempts it; A ends
    # at 2.5, late. Of the two sharing that busy period, A is the longer: it goes, B is on time.
    jobs = [Job(0.0, 2.0, 200), Job(1.0, 1.5, 50)]
    assert prefill_only_bound(jobs, 100.0) == BoundResult(100.0, 2, 1, (0,))
    # with a later deadline A fits around B: both on time
    assert prefill_only_bound([Job(0.0, 2.5, 200), Job(1.0, 1.5, 50)], 100.0).on_time == 2


def test_a_job_late_even_alone_costs_no_other():
    # the middle job needs 2 s but is due 1 s after it arrives: dropped first, while the long first job,
    # which Moore-Hodgson would otherwise drop in its place, stays
    jobs = [Job(0.0, 3.0, 250), Job(0.0, 1.0, 200), Job(5.0, 6.0, 50)]
    assert prefill_only_bound(jobs, 100.0) == BoundResult(100.0, 3, 2, (1,))


def test_separate_busy_periods_do_not_compete():
    # two bursts, each just fitting, with idle time between: a long job of the first burst is never
    # dropped for a miss in the second
    jobs = [Job(0.0, 4.0, 400), Job(10.0, 10.5, 50), Job(10.0, 11.0, 50)]
    assert prefill_only_bound(jobs, 100.0).on_time == 3
    jobs.append(Job(10.0, 11.0, 60))  # the second burst overflows: its longest job goes, not the 400
    assert prefill_only_bound(jobs, 100.0) == BoundResult(100.0, 4, 3, (3,))


def test_edges():
    assert prefill_only_bound([], 100.0).share == 1.0
    inf = prefill_only_bound([Job(0.0, float("inf"), 10**6)] * 3, 1.0)
    assert inf.on_time == 3
    with pytest.raises(ValueError, match="positive"):
        prefill_only_bound([Job(0.0, 1.0, 1)], 0.0)


def random_jobs(rng: random.Random, n: int, common_release: bool) -> list[Job]:
    jobs = []
    for _ in range(n):
        release = 0.0 if common_release else rng.choice([0.0, 0.5, 1.0, 1.5, 3.0]) + rng.random() * 0.2
        tokens = rng.randint(10, 300)
        jobs.append(Job(release, release + rng.uniform(0.2, 4.0), tokens))
    return jobs


@pytest.mark.parametrize("common_release", [True, False])
def test_against_brute_force(common_release):
    rng, below = random.Random(1234), 0
    for _ in range(300):
        jobs = random_jobs(rng, rng.randint(1, 8), common_release)
        result = prefill_only_bound(jobs, 100.0)
        kept = [j for i, j in enumerate(jobs) if i not in result.dropped]
        assert edf_on_time(kept, 100.0), "every set the bound keeps is on time under EDF"
        best = brute_force(jobs, 100.0)
        assert result.on_time <= best
        if common_release:
            assert result.on_time == best  # Moore-Hodgson is optimal with one release time
        below += result.on_time < best
    if not common_release:
        assert below <= 300 * 0.1, f"{below} of 300 below the optimum"  # a heuristic, but a close one


def test_a_busy_level_is_quick():
    import time

    rng = random.Random(0)
    jobs = []
    t = 0.0
    for _ in range(1000):  # 16 rps for about a minute, prompts of 50-600 tokens, overloaded
        t += rng.expovariate(16.0)
        jobs.append(Job(t, t + rng.choice([2.0, 5.0]), rng.randint(50, 600)))
    start = time.perf_counter()
    result = prefill_only_bound(jobs, 2000.0)
    assert time.perf_counter() - start < 5.0
    assert 0 < result.on_time < 1000
