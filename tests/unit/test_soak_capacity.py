"""The soak's capacity search (benchmarks/soak_capacity.py), without a server."""

from __future__ import annotations

import pytest

from benchmarks.soak_capacity import (
    ProbeLevel,
    attainment_by_window,
    capacity_rps,
    judge_level,
    met_slo,
    next_rps,
    search,
)
from benchmarks.soak_records import CANCEL, COMPLETE, DONE, REFUSED, STALLED, SoakRecord
from harness.slo_targets import SloTargets

SLOS = SloTargets(tpot_ms={"coding": 60, "chat": 84, "summary": 250}, ttft_ms={"coding": 2000, "chat": 2000,
                                                                                  "summary": 5000})


def rec(ttft_s=0.5, tpot_s=0.05, tokens=11, outcome=DONE, kind=COMPLETE, category="coding") -> SoakRecord:
    first = 10.0 + ttft_s
    return SoakRecord("r", kind, category, 10.0, first_token_s=first, end_s=first + tpot_s * (tokens - 1),
                      events=tokens, outcome=outcome, output_tokens=tokens)


def test_a_request_meets_its_slo_only_with_both_targets_and_a_token_count():
    assert met_slo(rec(), SLOS)
    assert not met_slo(rec(ttft_s=2.1), SLOS)
    assert not met_slo(rec(tpot_s=0.07), SLOS) and met_slo(rec(tpot_s=0.07, category="chat"), SLOS)
    assert met_slo(rec(tokens=1), SLOS)  # no time between tokens to judge
    assert not met_slo(rec(outcome=REFUSED), SLOS)
    no_usage = rec()
    no_usage.output_tokens = None
    assert not met_slo(no_usage, SLOS)


def test_a_level_judges_the_streams_read_to_their_end_and_counts_every_hang():
    records = [rec(), rec(ttft_s=3), rec(outcome=REFUSED), rec(kind=CANCEL), rec(kind=CANCEL, outcome=STALLED)]
    level = judge_level(8, records, SLOS)
    assert (level.judged, level.met, level.refused, level.hangs) == (3, 1, 1, 1)
    assert level.attainment == pytest.approx(1 / 3) and not level.passed
    late = judge_level(8, records, SLOS, from_s=11.0)  # every request arrived at 10 s
    assert (late.judged, late.hangs) == (0, 1) and not late.passed


def lv(rps, passed):
    return ProbeLevel(rps, 100, 95 if passed else 50, 0, 0)


def test_the_search_doubles_then_bisects_until_the_gap_is_within_the_resolution():
    assert next_rps([], 4, 0.2) == 4
    assert next_rps([lv(4, True), lv(8, True)], 4, 0.2) == 16
    assert next_rps([lv(4, True), lv(8, True), lv(16, False)], 4, 0.2) == 12
    assert next_rps([lv(4, True), lv(8, True), lv(16, False), lv(12, True)], 4, 0.2) == 14
    settled = [lv(4, True), lv(8, True), lv(16, False), lv(12, True), lv(14, False)]
    assert next_rps(settled, 4, 0.2) is None and capacity_rps(settled) == 12
    assert next_rps([lv(4, False)], 4, 0.2) == 2  # halves below a first level that misses
    assert next_rps([lv(0.3, False)], 4, 0.2) is None and capacity_rps([lv(0.3, False)]) is None


def test_search_runs_levels_against_a_machine_with_a_capacity():
    def run_level(rps):  # attains every request up to 10 rps, none beyond
        return [rec(ttft_s=0.5 if rps <= 10 else 3)] * 20

    seen = []
    capacity, levels = search(run_level, SLOS, start_rps=4, report=seen.append)
    assert capacity == 10 and [x.rps for x in levels] == [4, 8, 16, 12, 10] and seen == levels


def test_the_soak_reads_its_own_attainment_per_window():
    early, late = rec(), rec(ttft_s=3)
    late.arrival_s, late.first_token_s, late.end_s = 70.0, 73.0, 73.5
    windows = attainment_by_window([early, late], SLOS, duration_s=120, window_s=60)
    assert [(w["start_s"], w["judged"], w["attainment"]) for w in windows] == [(0.0, 1, 1.0), (60.0, 1, 0.0)]
