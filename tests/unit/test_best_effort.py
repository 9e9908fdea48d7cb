"""Requests without targets (best effort) beside requests with SLOs, in the scheduler alone on a fake
clock: they run on the capacity the SLO requests leave, are displaced when an SLO request would not
otherwise fit, and are never refused for a deadline they did not ask for."""

from __future__ import annotations

from adaserve_backend.request import Request
from adaserve_backend.sequence import Sequence
from adaserve_backend.slo import BEST_EFFORT, SLO
from tests.unit.test_scheduler import START, TableEstimator, _ids, admitted, cached, decoding, running, scheduler, seq

TABLE = {1: 0.05, 2: 0.08, 3: 0.1, 4: 0.12}  # s per token by batch size (x1.15 admission headroom)


def best_effort(prompt=8, max_tokens=100, arrival=0.0) -> Sequence:
    req = Request(f"b{next(_ids)}", [5] * prompt, max_tokens=max_tokens)
    return Sequence(req, next(_ids), SLO(slo_class=BEST_EFFORT), arrival, frozenset(), None, prompt)


def with_ttft(tpot_ms: float, ttft_ms: float, arrival: float) -> Sequence:
    req = Request(f"t{next(_ids)}", [5] * 8, max_tokens=100)
    return Sequence(req, next(_ids), SLO(tpot_ms, ttft_ms), arrival, frozenset(), None, 8)


def test_best_effort_starts_only_where_it_keeps_the_slo_requests_on_track():
    sched = scheduler(TableEstimator(TABLE))
    decoding(running(sched, seq(100))[0], 10, 0.5)  # 0.6 s ahead: on track at 92 ms per token
    assert admitted(sched, [best_effort()]) == [float("inf")]

    sched = scheduler(TableEstimator(TABLE))
    decoding(running(sched, seq(60))[0], 10, 0.6)  # on track at 50 ms per token, not at 92
    b = best_effort()
    assert admitted(sched, [b]) == [] and list(sched.waiting) == [b]


def test_an_slo_request_that_does_not_fit_displaces_the_newest_best_effort_one():
    sched = scheduler(TableEstimator(TABLE))
    slo, old, new = running(sched, seq(100), best_effort(), best_effort(arrival=1.0))
    decoding(slo, 10, 0.5)
    decoding(old, 10, 0.5)
    decoding(new, 2, 0.1)
    waiting = seq(100, arrival=2.0)  # 138 ms per token with four running; 92 with two (after one leaves)
    assert admitted(sched, [waiting]) == [100]
    assert sched.num_preemptions == 2 and sched.running == [slo, waiting] and set(sched.waiting) == {old, new}

    # one that cannot make its target even with every best-effort request gone displaces none
    sched = scheduler(TableEstimator(TABLE))
    slo, b = running(sched, seq(100), best_effort())
    decoding(slo, 10, 0.5)
    decoding(b, 10, 0.5)
    assert admitted(sched, [seq(60)]) == [] and sched.num_preemptions == 0 and sched.running == [slo, b]


def test_an_slo_request_the_cache_cannot_hold_displaces_best_effort_first():
    sched = scheduler(TableEstimator(), num_blocks=5)
    b, tight = running(sched, best_effort(prompt=7), seq(300, prompt=7, arrival=1.0))
    for s in (b, tight):
        cached(sched, s, 8)  # two full blocks each, one free: each decode token needs a block of its own
    plan = sched.schedule(START)
    assert plan.decode == [tight] and list(sched.waiting) == [b]  # not the newest: the one without targets


def test_best_effort_is_never_refused_for_a_deadline_while_slo_requests_are():
    est = TableEstimator(TABLE, prefill_token_s=0.5)  # 4 s to a first token of 8 prompt tokens
    sched = scheduler(est, overload="reject")
    decoding(running(sched, seq(60))[0], 10, 0.6)  # holds admissions
    late, b = with_ttft(100, 1000, arrival=START), best_effort(arrival=START)
    sched.add(late)
    sched.add(b)
    plan = sched.schedule(START)
    assert [s for s, _ in plan.rejected] == [late] and list(sched.waiting) == [b]
    for t in range(1, 20):
        assert not sched.schedule(START + t).rejected and b in sched.waiting
