"""The predictor's own record: what admission expected of each request's first token and what the
estimator expected of each decode step, carried to the metrics that compare them with what happened."""

from __future__ import annotations

from adaserve_backend.output_processor import make_output
from adaserve_backend.scheduler.plan import IterationPlan
from tests.unit.test_scheduler import START, TableEstimator, scheduler, seq


def test_admission_records_its_first_token_prediction_and_the_output_carries_it():
    est = TableEstimator({1: 0.05}, prefill_token_s=0.01)
    sched = scheduler(est)
    s = seq(100, prompt=20, arrival=START - 0.5)
    sched.add(s)
    sched.schedule(START)
    assert s in sched.running and s.predicted_first_token == START + est.first_token_s(0, 20, 256)
    stats = make_output(s, [], START, None).stats
    assert abs(stats.predicted_ttft_s - (0.5 + est.first_token_s(0, 20, 256))) < 1e-9


def test_a_decode_step_is_predicted_before_its_measurement_updates_the_estimator():
    sched = scheduler(TableEstimator({1: 0.05}))
    plan = IterationPlan(start=START)
    plan.decode = [seq(100)]
    assert sched._predicted_s(plan) == TableEstimator.ITERATION_S
