"""Roofline fit, budget choice and the cost model's iteration prediction (pure, no timing)."""

from __future__ import annotations

import pytest

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline, fit_roofline, pick_budget, through_points
from adaserve_backend.scheduler.control import adaptive_depth_width, ends_within_slo, paced_chunk, slo_slack_s
from adaserve_backend.config import SpeculationConfig

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
    points = ((1, 55.0), (2, 80.0), (8, 69.0), (16, 85.0))
    assert [through_points(points, line, n) for n in (1, 2, 5, 8, 12, 16, 20)] == [55.0, 80.0, 74.5, 69.0, 77.0, 85.0, 93.0]
    assert through_points((), line, 20) == line.predict(20)
    draft_points = ((1, 1.5), (2, 1.6), (8, 2.0), (16, 3.0))
    model = CostModel(line, Roofline(2.0, 4, 0.5), budget=12, verify_points=points, draft_points=draft_points)
    assert model.verify_ms(1) == 55.0 and model.draft_ms(1, 3, 4) == pytest.approx(1.5 + 2 * (1.6 + 0.4 * 2 / 6))
    model.save(str(tmp_path / "profile.json"))
    assert CostModel.load(str(tmp_path / "profile.json")) == model


def test_adaptive_depth_and_width_shrink_with_load():
    cfg = SpeculationConfig(budget=48, draft_budget=16, d_min=1, d_max=6, w_max=4, c1=2, c2=0)
    assert adaptive_depth_width(1, 48, cfg) == (6, 4)
    assert adaptive_depth_width(8, 48, cfg) == (3, 2)
    assert adaptive_depth_width(64, 48, cfg) == (1, 1)


def test_slo_slack_counts_on_one_token_per_iteration():
    # 10 tokens decoded in 0.5 s under a 100 ms SLO, next iteration 50 ms: may lose 0.55 s more
    assert slo_slack_s(0.5, 0.05, 0.1, 10) == pytest.approx(0.55)
    assert slo_slack_s(1.2, 0.05, 0.1, 10) == pytest.approx(-0.15)  # behind schedule
    # behind by 0.15 s: 50 more tokens at 90 ms recover 0.5 s; at 99.9 ms they do not
    assert ends_within_slo(-0.15, 0.1, 50, 0.09) and not ends_within_slo(-0.15, 0.1, 50, 0.0999)
    # ahead by 0.1 s: 50 more tokens at 101 ms eat 0.05 s of it, at 103 ms all of it and more
    assert ends_within_slo(0.1, 0.1, 50, 0.101) and not ends_within_slo(0.1, 0.1, 50, 0.103)


def test_paced_chunk_is_the_largest_chunk_the_allowance_pays_for():
    cost = CostModel(Roofline(20.0, 16, 2.0), Roofline(2.0, 4, 0.5), budget=16)

    def extra(c):
        return cost.chunk_extra_ms(4, 16, c)

    assert extra(10) == pytest.approx(10 * 2.0 + 10 * 0.5)  # verification at the knee; draft past it
    for allowance in (0.0, 1.0, 24.9, 25.0, 100.0):
        c = paced_chunk(allowance, extra, cap=256)
        assert extra(c) <= allowance < extra(c + 1)
    assert paced_chunk(1e9, extra, cap=64) == 64
    assert paced_chunk(-1.0, extra, cap=64) == 0  # behind schedule: no prefill rides along
    # tokens in the flat region cost nothing: two verified tokens leave 14 free below the knee
    flat_draft = CostModel(cost.target, Roofline(2.0, 32, 0.5), budget=16)
    assert paced_chunk(0.0, lambda c: flat_draft.chunk_extra_ms(1, 2, c), cap=64) == 14


def test_engine_json_profile_path_is_relative_to_the_file(tmp_path):
    import json

    from adaserve_backend.config import EngineConfig

    (tmp_path / "engine.json").write_text(json.dumps({"speculation": {"profile_path": "profile.json"}, "draft": None}))
    cfg = EngineConfig.from_json(str(tmp_path / "engine.json"))
    assert cfg.speculation.profile_path == str(tmp_path / "profile.json") and cfg.draft is None
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig.from_dict({"scheduler": {"polcy": "adaserve"}})
