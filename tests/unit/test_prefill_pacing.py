"""scheduler/prefill_pacing.py: the prefill chunk the decoding requests' slack pays for."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.scheduler.prefill_pacing import WITHIN_TPOT_SHARE, chunk_within_tpot, paced_chunk, prefill_budget


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


class _Est:
    """An estimator whose iteration takes `iter_ms` and whose chunk adds 1 ms a token."""

    def __init__(self, iter_ms: float) -> None:
        self.iter_ms = iter_ms

    def iteration_s(self, n, depth, width):
        return self.iter_ms / 1e3

    def chunk_extra_ms(self, n, depth, chunk):
        return float(chunk)

    def prefill_iteration_s(self, n, chunk):
        return (self.iter_ms + chunk) / 1e3


def _seq(tpot_ms: float | None, deadline: float = math.inf, left: int = 0):
    from adaserve_backend.slo import SLO

    return SimpleNamespace(slo=SLO(tpot_ms=tpot_ms), deadline=deadline, prefill_goal=left, prefilled=0,
                           arrival=0.0, edf_tiebreak=0)


def test_a_chunk_within_tpot_keeps_the_iteration_inside_the_tightest_decoding_target():
    decode = [_seq(80.0), _seq(60.0), _seq(None)]
    # 40 ms + 8 tokens = 48 ms, the share of the 60-ms target the chunk aims at
    assert chunk_within_tpot(decode, 2, 2, _Est(40.0), cap=256) == 8 == round(WITHIN_TPOT_SHARE * 60 - 40)
    assert chunk_within_tpot(decode, 2, 2, _Est(70.0), cap=256) == 0  # the decodes alone are past it
    assert chunk_within_tpot([_seq(None)], 2, 2, _Est(70.0), cap=256) == 256  # best effort: no pace to keep


def test_within_tpot_cuts_pacing_but_never_below_what_a_deadline_needs(monkeypatch):
    from adaserve_backend.scheduler import prefill_pacing

    monkeypatch.setattr(prefill_pacing, "_prefill_budget", lambda *a: 256)
    decode = [_seq(60.0)]
    assert prefill_budget([], decode, 2, 2, 0.0, _Est(40.0), 256, within_tpot=True) == 8
    assert prefill_budget([], decode, 2, 2, 0.0, _Est(40.0), 256, within_tpot=False) == 256
    monkeypatch.setattr(prefill_pacing, "urgent_chunk", lambda *a: 100)  # a first token due soon
    assert prefill_budget([_seq(60.0)], decode, 2, 2, 0.0, _Est(40.0), 256, within_tpot=True) == 100
