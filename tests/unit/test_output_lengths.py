"""scheduler/output_lengths.py: lengths learned from finished requests, planned as a range conditioned
on what a request produced so far; and slo_slack.planned_remaining taking its pessimistic end."""

from __future__ import annotations

import itertools

import pytest

from adaserve_backend.config import SchedulerConfig
from adaserve_backend.request import Request
from adaserve_backend.scheduler.output_lengths import LengthHistory, OutputLengthPredictor, prompt_bucket, quantile
from adaserve_backend.scheduler.slo_slack import planned_remaining
from adaserve_backend.sequence import Sequence
from adaserve_backend.slo import SLO

_ids = itertools.count()


def finished(length: int, prompt: int = 20, tpot_ms: float = 80.0, max_tokens: int = 200, **req) -> Sequence:
    s = Sequence.start(Request(f"r{next(_ids)}", [5] * prompt, max_tokens=max_tokens, **req), next(_ids),
                       SLO(tpot_ms, 2000.0), 0.0, frozenset())
    s.output = [7] * length
    return s


def test_history_keeps_a_sorted_window_and_answers_what_lies_beyond():
    h = LengthHistory(window=3)
    for n in (30, 10, 20, 40):
        h.add(n)
    assert h.sorted == [10, 20, 40]  # 30, the oldest, left the window
    assert h.beyond(15) == [20, 40] and h.beyond(40) == []


def test_nearest_rank_quantile():
    values = list(range(1, 11))
    assert quantile(values, 0.9) == 9 and quantile(values, 0.1) == 1 and quantile(values, 0.5) == 5
    assert prompt_bucket(20) == prompt_bucket(31) != prompt_bucket(32)


def test_plans_with_the_cap_until_enough_requests_finished():
    p = OutputLengthPredictor(0.9, min_samples=16)
    seq = finished(3)
    p.plan(seq)
    assert seq.remaining_range is None and planned_remaining(seq, 1.0) == seq.remaining == 200 - 3 - 1


def test_range_is_conditioned_on_what_the_request_produced_so_far():
    p = OutputLengthPredictor(0.9, min_samples=16)
    for n in range(10, 110):  # lengths 10..109, same targets and prompt bucket
        p.observe(finished(n))
    fresh = finished(1)
    p.plan(fresh)
    lo, hi = fresh.remaining_range
    assert (lo, hi) == (19 - 2, 99 - 2)  # 10% and 90% of 10..109, less the produced token and the next one
    assert fresh.predicted_length == 59  # the median, whose error is measured
    late = finished(90)
    p.plan(late)  # beyond 90: 91..109, whose 10% and 90% are 92 and 108
    assert late.remaining_range == (92 - 91, 108 - 91)
    outlier = finished(100)  # only 9 longer ever seen: too few to say, the cap
    p.plan(outlier)
    assert outlier.remaining_range is None
    # the pessimistic end: long when tokens come slower than the target, short when faster
    assert planned_remaining(fresh, 0.09) == hi and planned_remaining(fresh, 0.05) == lo


def test_the_cap_and_min_tokens_bound_the_range():
    p = OutputLengthPredictor(0.9, min_samples=4)
    for n in (50, 60, 70, 80):
        p.observe(finished(n))
    capped = finished(2, max_tokens=40)
    p.plan(capped)
    assert capped.remaining_range == (37, 37)
    floored = finished(2, min_tokens=70, max_tokens=200)
    p.plan(floored)
    assert floored.remaining_range[0] == 70 - 2 - 1


def test_fixed_lengths_are_planned_with_the_cap_and_teach_nothing():
    p = OutputLengthPredictor(0.9, min_samples=1)
    p.observe(finished(5, ignore_eos=True))
    p.observe(finished(5, min_tokens=200))
    assert not p.histories
    p.observe(finished(5))
    exact = finished(1, ignore_eos=True)
    p.plan(exact)
    assert exact.remaining_range is None


def test_kinds_fall_back_from_prompt_bucket_to_targets_to_all():
    p = OutputLengthPredictor(0.9, min_samples=2)
    for n in (40, 40, 40):
        p.observe(finished(n, prompt=500, tpot_ms=150.0))  # another class entirely
    chat = finished(1, prompt=20, tpot_ms=80.0)
    p.plan(chat)
    assert chat.remaining_range == (38, 38)  # only what all requests say
    for n in (10, 10):
        p.observe(finished(n, prompt=200, tpot_ms=80.0))  # its class, another prompt bucket
    p.plan(chat)
    assert chat.remaining_range == (8, 8)


def test_error_is_measured_on_the_first_median_prediction():
    """predicted_length (what the metric's error is taken on) is the first median, not later ones."""
    p = OutputLengthPredictor(0.9, min_samples=2)
    for n in (20, 20, 20):
        p.observe(finished(n))
    seq = finished(1)
    p.plan(seq)
    assert seq.predicted_length == 20
    seq.output = [7] * 10
    p.plan(seq)
    assert seq.predicted_length == 20


def test_config_validates_the_quantile():
    assert SchedulerConfig(output_length_quantile=None).output_length_quantile is None
    for bad in (0.2, 1.0, "high"):
        with pytest.raises(ValueError, match="output_length_quantile"):
            SchedulerConfig(output_length_quantile=bad)


def test_kinds_of_requests_are_bounded_whatever_targets_clients_choose():
    predictor = OutputLengthPredictor(0.9, max_kinds=8)
    for tpot in range(50):
        predictor.observe(finished(5, tpot_ms=10 + tpot))
    assert len(predictor.histories) == 8
    assert () in predictor.histories  # every request teaches the catch-all, so it is never the oldest
