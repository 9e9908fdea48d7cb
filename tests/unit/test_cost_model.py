"""Roofline fit, budget choice and the cost model's iteration prediction (pure, no timing)."""

from __future__ import annotations

import pytest

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline, fit_roofline, pick_budget
from adaserve_backend.scheduler.control import adaptive_depth_width
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


def test_adaptive_depth_and_width_shrink_with_load():
    cfg = SpeculationConfig(budget=48, draft_budget=16, d_min=1, d_max=6, w_max=4, c1=2, c2=0)
    assert adaptive_depth_width(1, 48, cfg) == (6, 4)
    assert adaptive_depth_width(8, 48, cfg) == (3, 2)
    assert adaptive_depth_width(64, 48, cfg) == (1, 1)


def test_engine_json_profile_path_is_relative_to_the_file(tmp_path):
    import json

    from adaserve_backend.config import EngineConfig

    (tmp_path / "engine.json").write_text(json.dumps({"speculation": {"profile_path": "profile.json"}, "draft": None}))
    cfg = EngineConfig.from_json(str(tmp_path / "engine.json"))
    assert cfg.speculation.profile_path == str(tmp_path / "profile.json") and cfg.draft is None
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig.from_dict({"scheduler": {"polcy": "adaserve"}})
