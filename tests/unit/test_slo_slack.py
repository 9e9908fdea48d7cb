"""scheduler/slo_slack.py: how far a request is ahead of its TPOT target (pure formulas)."""

from __future__ import annotations

import pytest

from adaserve_backend.scheduler.slo_slack import ends_within_slo, slo_slack_s


def test_slo_slack_counts_on_one_token_per_iteration():
    # 10 tokens decoded in 0.5 s under a 100 ms SLO, next iteration 50 ms: may lose 0.55 s more
    assert slo_slack_s(0.5, 0.05, 0.1, 10) == pytest.approx(0.55)
    assert slo_slack_s(1.2, 0.05, 0.1, 10) == pytest.approx(-0.15)  # behind schedule
    # behind by 0.15 s: 50 more tokens at 90 ms recover 0.5 s; at 99.9 ms they do not
    assert ends_within_slo(-0.15, 0.1, 50, 0.09) and not ends_within_slo(-0.15, 0.1, 50, 0.0999)
    # ahead by 0.1 s: 50 more tokens at 101 ms eat 0.05 s of it, at 103 ms all of it and more
    assert ends_within_slo(0.1, 0.1, 50, 0.101) and not ends_within_slo(0.1, 0.1, 50, 0.103)
