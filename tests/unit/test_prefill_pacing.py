"""scheduler/prefill_pacing.py: the prefill chunk the decoding requests' slack pays for."""

from __future__ import annotations

import pytest

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.scheduler.prefill_pacing import paced_chunk


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
