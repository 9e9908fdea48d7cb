"""scheduler/control.py: adaptive depth and width, SLO slack, and prefill pacing (pure formulas)."""

from __future__ import annotations

import pytest

from adaserve_backend.config import SpeculationConfig
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.scheduler.control import adaptive_depth_width, ends_within_slo, paced_chunk, slo_slack_s


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
