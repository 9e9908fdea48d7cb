"""The predictor's own record: what admission expected of each request's first token and what the
estimator expected of each decode step, carried to the metrics that compare them with what happened."""

from __future__ import annotations

from adaserve_backend.output_processor import make_output
from adaserve_backend.scheduler.plan import IterationPlan, predicted_decode_s
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
    assert predicted_decode_s(sched.estimator, plan) == TableEstimator.ITERATION_S


def test_requests_admitted_together_share_the_last_chunk_of_the_first():
    """Chunks are packed in deadline order: with none decoding, a prompt admitted beside later ones ends
    in an iteration they fill, and its first token comes when that iteration ends."""
    from tests.unit.test_decode_estimator import estimator

    est = estimator()
    assert est.first_token_s(0, 100, 256, behind=100) == est.prefill_iteration_s(0, 200)
    assert est.first_token_s(0, 300, 256, behind=500) == est.prefill_iteration_s(0, 256) * 2
    first_token_s = {}

    class Recording(TableEstimator):
        def first_token_s(self, n, tokens, chunk, behind=0):
            first_token_s[tokens] = behind
            return super().first_token_s(n, tokens, chunk, behind)

    sched = scheduler(Recording({1: 0.05}))
    a, b = seq(100, prompt=20, arrival=START - 0.2), seq(100, prompt=30, arrival=START - 0.1)
    sched.add(a)
    sched.add(b)
    sched.schedule(START)
    assert first_token_s[20] == 30 and first_token_s[50] == 0  # a before b (EDF), b with a's 20 ahead


def test_beside_decodes_a_first_token_is_predicted_at_the_paced_chunk_not_the_cap(monkeypatch):
    """Pacing gives a prompt fewer tokens per iteration than the cap while others decode; its first
    token is predicted at what pacing gives now."""
    from adaserve_backend.scheduler import first_tokens
    from tests.unit.test_deadlines import Clock, arrive, deadline_scheduler, step

    est = TableEstimator({1: 0.05, 2: 0.05}, prefill_token_s=0.001)
    sched, clock = deadline_scheduler(est), Clock()
    arrive(sched, "decoding", clock, ttft_ms=5000, max_tokens=50)
    step(sched, clock)
    assert [s.decoding for s in sched.running] == [True]
    monkeypatch.setattr(first_tokens, "prefill_budget", lambda *a, **k: 64)
    later = arrive(sched, "later", clock, ttft_ms=5000, prompt=300)
    sched.schedule(clock.now)
    assert later.predicted_first_token == clock.now + est.first_token_s(1, 300, 64)
