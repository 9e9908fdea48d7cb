"""The decode-aware ceiling (harness/decode_ceiling.py): the exact optimum of the decode-aware model,
against brute force over every subset (feasibility by tests/unit/test_decode_bound.py's independent EDF
simulation), never below the dropping heuristic, monotone in the decode rate, and an upper bound still
when the solver is stopped early."""

from __future__ import annotations

import math
import random

import pytest

from harness.decode_bound import decode_aware_bound
from harness.decode_ceiling import CeilingResult, decode_aware_ceiling
from harness.prefill_bound import Job, prefill_only_bound
from tests.unit.test_decode_bound import brute_force, edf_on_time, job, random_jobs


@pytest.mark.parametrize("common_release", [True, False])
def test_the_ceiling_is_the_optimum(common_release):
    rng, above_heuristic = random.Random(4321), 0
    for _ in range(150):
        jobs = random_jobs(rng, rng.randint(2, 8), common_release)
        ceiling = decode_aware_ceiling(jobs, 100.0, 50.0)
        assert ceiling.exact and ceiling.on_time == brute_force(jobs, 100.0, 50.0)
        assert len(ceiling.served) == ceiling.on_time and edf_on_time([jobs[i] for i in ceiling.served], 100.0, 50.0)
        heuristic = decode_aware_bound(jobs, 100.0, 50.0).on_time
        assert ceiling.on_time >= heuristic
        above_heuristic += ceiling.on_time > heuristic
    assert above_heuristic > 0  # instances where the heuristic falls short exist, and the ceiling sees them


def test_slower_decoding_never_serves_more_and_free_decoding_is_prefill_only():
    rng = random.Random(11)
    for _ in range(30):
        jobs = random_jobs(rng, rng.randint(1, 30))
        served = [decode_aware_ceiling(jobs, 100.0, d).on_time for d in (math.inf, 400.0, 100.0, 40.0, 10.0)]
        assert served == sorted(served, reverse=True), served
        prefill_only = prefill_only_bound([Job(j.release_s, j.first_deadline_s, j.prompt_tokens) for j in jobs], 100.0)
        assert served[0] >= prefill_only.on_time  # the prefill-only optimum; its heuristic may fall short


def test_stopped_early_it_is_still_an_upper_bound():
    # one solve, before any window is known: every request not late alone counts
    jobs = [job(0.0, 1.5, 50, outputs=11, tpot=0.02), job(0.0, 1.5, 50, outputs=11, tpot=0.02),
            job(0.0, 1.0, 500)]  # the third is late even alone
    first = decode_aware_ceiling(jobs, 100.0, 20.0, rounds=1)
    assert first == CeilingResult(3, 2, False, (0, 1))
    full = decode_aware_ceiling(jobs, 100.0, 20.0)  # both decodes do not fit: one of the two
    assert full.on_time == 1 and full.exact and len(full.served) == 1
    rng = random.Random(5)
    for _ in range(50):
        jobs = random_jobs(rng, rng.randint(2, 8))
        early = decode_aware_ceiling(jobs, 100.0, 50.0, rounds=1)
        assert early.on_time >= brute_force(jobs, 100.0, 50.0)


def test_edges():
    assert decode_aware_ceiling([], 100.0, 10.0) == CeilingResult(0, 0, True, ())
    assert decode_aware_ceiling([job(0.0, math.inf, 10**6, outputs=10**6)] * 3, 1.0, 1.0).on_time == 3
    with pytest.raises(ValueError, match="positive"):
        decode_aware_ceiling([job(0.0, 1.0, 1)], 100.0, 0.0)


def test_a_busy_level_is_solved_in_seconds():
    import time

    rng = random.Random(0)
    jobs, t = [], 0.0
    for i in range(240):  # 4 rps for a minute in bursts: every other 20 arrivals come 9x closer together
        t += rng.expovariate(4.0) * (0.2 if (i // 20) % 2 else 1.8)
        prompt, ttft, tpot = rng.choice([(130, 2.0, 0.06), (60, 2.0, 0.084), (480, 5.0, 0.25)])
        jobs.append(job(t, ttft, prompt, outputs=rng.randint(16, 96), tpot=tpot))
    start = time.perf_counter()
    ceiling = decode_aware_ceiling(jobs, 1500.0, 300.0)
    assert time.perf_counter() - start < 10.0
    heuristic = decode_aware_bound(jobs, 1500.0, 300.0).on_time
    assert ceiling.exact and heuristic <= ceiling.on_time < 240
