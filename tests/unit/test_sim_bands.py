"""sim/bands.py: the simulator judged against repeated measured runs of each level (sim.validate on a
repeated bench: test_sim_tools.py)."""

from __future__ import annotations

import pytest

from sim import validate
from sim.bands import Band, bands


def band(measured, predicted, requests=100):
    return Band("adaserve", {"rps": 4.0}, tuple(measured), tuple(predicted), requests)


def test_inside_the_band_or_near_its_edge():
    assert band([0.7, 0.8, 0.9], [0.75, 0.8, 0.82]).inside
    assert band([0.7, 0.8, 0.9], [0.94, 0.95, 0.96]).inside  # 0.05 past the top edge at most
    assert not band([0.7, 0.8, 0.9], [0.5, 0.6, 0.6]).inside


def test_no_worse_than_a_re_run_of_the_real_system():
    noisy = band([0.6, 0.8, 0.9], [0.78, 0.8, 0.85])  # the re-runs scatter; a steady prediction beats them
    assert noisy.rerun_error == pytest.approx((0.25 + 0.05 + 0.2) / 3)
    assert noisy.sim_error == pytest.approx((0.07 + 0.05 + 0.15) / 3) and noisy.no_worse  # S_i vs the others' median
    assert noisy.median_error == pytest.approx(0.0)  # the lenient variant: medians against medians
    # a prediction whose median sits on the measured median yet misses each repeat fails (b)
    swung = band([0.7, 0.8, 0.9], [0.6, 0.8, 0.95])
    assert swung.median_error == pytest.approx(0.0) and not swung.no_worse
    assert not band([0.8, 0.81, 0.8], [0.7, 0.7, 0.7]).no_worse
    # identical re-runs: an error of one request's share of attainment is no error
    assert band([1.0, 1.0, 1.0], [0.99, 0.99, 1.0]).no_worse and not band([1.0, 1.0, 1.0], [0.9, 0.9, 1.0]).no_worse


def test_bands_group_the_repeats_of_each_policy_and_level():
    rows = [{"rps": r, "repeat": k, "policy": p, "requests": 10, "slo_attainment": 0.5 + 0.1 * k}
            for r in (1.0, 2.0) for p in ("a", "b")
            for k in range(3)] + [{"rps": 3.0, "policy": "a", "slo_attainment": 1.0}]
    found = bands(rows, [{**r, "slo_attainment": 0.6} for r in rows], validate.level_of)
    assert [(b.policy, b.level) for b in found] == [("a", {"rps": 1.0}), ("b", {"rps": 1.0}),
                                                    ("a", {"rps": 2.0}), ("b", {"rps": 2.0})]
    assert all(b.measured == pytest.approx((0.5, 0.6, 0.7)) and b.inside and b.no_worse for b in found)
