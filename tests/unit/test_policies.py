"""scheduler/policies.py: AdaServe's adaptive depth and width (the paper's formulas)."""

from __future__ import annotations

from adaserve_backend.config import SpeculationConfig
from adaserve_backend.scheduler.speculation_size import adaptive_depth_width


def test_adaptive_depth_and_width_shrink_with_load():
    cfg = SpeculationConfig(budget=48, draft_budget=16, d_min=1, d_max=6, w_max=4, c1=2, c2=0)
    assert adaptive_depth_width(1, 48, cfg) == (6, 4)
    assert adaptive_depth_width(8, 48, cfg) == (3, 2)
    assert adaptive_depth_width(64, 48, cfg) == (1, 1)
