"""Roofline fit, budget choice and the cost model's iteration prediction (pure, no timing)."""

from __future__ import annotations

import pytest

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline, fit_roofline, pick_budget, through_points

SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def test_fit_recovers_a_synthetic_roofline():
    truth = Roofline(flat_ms=10.0, knee=16, slope_ms=0.5)
    noisy = [truth.predict(n) * (1 + 0.01 * (-1) ** i) for i, n in enumerate(SIZES)]
    line = fit_roofline(SIZES, noisy)
    assert line.knee == 16
    assert line.flat_ms == pytest.approx(10.0, rel=0.02)
    assert line.slope_ms == pytest.approx(0.5, rel=0.05)


def test_budget_stays_within_the_allowed_slowdown():
    line = Roofline(flat_ms=10.0, knee=16, slope_ms=0.5)
    b = pick_budget(line, max_slowdown=1.3)
    assert b == 22 and line.predict(b) <= 13.0 < line.predict(b + 1)
    assert pick_budget(Roofline(10.0, 64, 0.0)) == 64  # never grows within the range: use the knee


def test_cost_model_round_trip_and_prediction(tmp_path):
    model = CostModel(Roofline(20.0, 16, 1.0), Roofline(2.0, 32, 0.1), budget=22)
    path = tmp_path / "profile.json"
    model.save(str(path), {"device": "test"})
    loaded = CostModel.load(str(path))
    assert loaded == model
    # 4 requests, depth 3, width 2: draft steps of 4, 8, 8 tokens (flat), verification of 30 tokens
    assert loaded.iteration_ms(4, 3, 2, 30) == pytest.approx(3 * 2.0 + 20.0 + 14 * 1.0)


def test_predictions_go_through_the_measured_points(tmp_path):
    line = Roofline(60.0, 8, 2.0)
    points = ((1, 55.0), (2, 61.0), (8, 73.0), (16, 85.0))
    assert [through_points(points, line, n) for n in (1, 2, 5, 8, 12, 16, 20)] == [55.0, 61.0,
                                                                                   67.0, 73.0, 79.0, 85.0, 93.0]
    assert through_points((), line, 20) == line.predict(20)
    draft_points = ((1, 1.5), (2, 1.6), (8, 2.0), (16, 3.0))
    model = CostModel(line, Roofline(2.0, 4, 0.5), budget=12, verify_points=points, draft_points=draft_points)
    assert model.verify_ms(1) == 55.0 and model.draft_ms(1, 3, 4) == pytest.approx(1.5 + 2 * (1.6 + 0.4 * 2 / 6))
    model.save(str(tmp_path / "profile.json"))
    assert CostModel.load(str(tmp_path / "profile.json")) == model


def test_a_point_above_a_later_one_is_lowered_to_it():
    """Profiled on a busy moment, one token measured slower than two: predictions never fall with size,
    or plain decoding would look dearer than a small speculative tree."""
    line = Roofline(60.0, 8, 2.0)
    points = ((1, 53.0), (2, 45.0), (4, 52.0), (8, 50.0), (16, 60.0))
    predicted = [through_points(points, line, n) for n in range(1, 20)]
    assert predicted == sorted(predicted)
    assert predicted[:4] == [45.0, 45.0, 47.5, 50.0] and through_points(points, line, 16) == 60.0
