"""Where the soak's load sits: the capacity of the served stack it is about to hold, measured on that
same server just before the soak, with the soak's own traffic.

A fixed rate means a different load on every machine, and on one machine from day to day: a rate at
capacity on a fast day is past it on a slow one, where refusals pile up and the TTFT p99 is the
admission deadline by construction, so the first/last comparison judges the queue, not the server.
The soak therefore measures capacity (the highest rate with joint SLO attainment >= 0.9) and runs at
a share of it.

The search: levels of `probe_s` seconds each, from `start_rps` doubling while the level attains,
then bisecting between the highest level that attained and the lowest that did not until they are
within `resolution` of each other (relative). A level starts with an empty queue, and a short run
from empty passes rates the server cannot sustain, so it is judged on the arrivals after its first
third, on the requests its clients meant to read to the end (cancelled and dropped streams have no
TPOT): met when the stream ended with both its TTFT and its TPOT (from the usage block's token
count) within the class's targets; refused, failed, hung or late is a miss. Each level's requests
are drawn from the soak's deck, so no prompt reaches the server twice across the probe and the soak.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from adaserve_backend.slo import attains_both, tpot_seconds
from harness.slo_targets import SloTargets

from .soak_records import COMPLETE, DONE, REFUSED, SoakRecord

ATTAINMENT_FLOOR = 0.9  # capacity's definition (DEVELOPERS.md): joint attainment >= 0.9
MIN_RPS = 0.25  # below this the server does not serve the soak's classes at all


@dataclass(frozen=True)
class ProbeLevel:
    rps: float
    judged: int  # requests planned to be read to their end
    met: int
    refused: int
    hangs: int  # of every request the level sent, cancelled and hostile ones included

    @property
    def attainment(self) -> float:
        return self.met / self.judged if self.judged else 0.0

    @property
    def passed(self) -> bool:
        return self.judged > 0 and self.attainment >= ATTAINMENT_FLOOR

    def to_dict(self) -> dict:
        return {**asdict(self), "attainment": round(self.attainment, 4), "passed": self.passed}


def met_slo(rec: SoakRecord, slos: SloTargets) -> bool:
    """Both targets met (adaserve_backend/slo.py's rule): the stream ended, its first token within the
    TTFT target, and its time per output token after the first within the TPOT target."""
    if rec.outcome != DONE or rec.ttft_s is None or rec.end_s is None or not rec.output_tokens:
        return False
    return attains_both(rec.ttft_s, tpot_seconds(rec.first_token_s, rec.end_s, rec.output_tokens),
                        slos.ttft(rec.category), slos.tpot(rec.category))


def judge_level(rps: float, records: Sequence[SoakRecord], slos: SloTargets, from_s: float = 0.0) -> ProbeLevel:
    """Judged: the requests arriving from `from_s` on, once the queue a level starts without has had
    time to build; hangs: all of them."""
    judged = [r for r in records if r.kind == COMPLETE and r.arrival_s >= from_s]
    return ProbeLevel(rps, len(judged), sum(met_slo(r, slos) for r in judged),
                      sum(r.outcome == REFUSED for r in judged), sum(r.hung for r in records))


def attainment_by_window(records: Sequence[SoakRecord], slos: SloTargets, duration_s: float,
                         window_s: float) -> list[dict]:
    """Joint attainment of the soak itself per window of arrivals: where its load sat against the
    capacity the probe measured (>= 0.9 in a window: at or below capacity there)."""
    out, start = [], 0.0
    while start < duration_s:
        lv = judge_level(0.0, [r for r in records if start <= r.arrival_s < start + window_s], slos)
        out.append({"start_s": start, "judged": lv.judged, "attainment": round(lv.attainment, 4),
                    "refused": lv.refused})
        start += window_s
    return out


def next_rps(levels: Sequence[ProbeLevel], start_rps: float, resolution: float) -> float | None:
    """The next level to try, or None once the search has settled."""
    if not levels:
        return start_rps
    passed = [lv.rps for lv in levels if lv.passed]
    failed = [lv.rps for lv in levels if not lv.passed]
    lo = max(passed, default=0.0)
    hi = min((r for r in failed if r > lo), default=None)
    if hi is None:
        return 2 * lo
    if lo == 0.0:
        return None if hi / 2 < MIN_RPS else hi / 2
    return None if hi - lo <= resolution * lo else (lo + hi) / 2


def capacity_rps(levels: Sequence[ProbeLevel]) -> float | None:
    """The highest level that attained, below the lowest that did not; None if none attained."""
    failed = [lv.rps for lv in levels if not lv.passed]
    below = [lv.rps for lv in levels if lv.passed and lv.rps < min(failed, default=float("inf"))]
    return max(below, default=None)


def search(run_level: Callable[[float], Sequence[SoakRecord]], slos: SloTargets, start_rps: float = 4.0,
           judge_from_s: float = 0.0, resolution: float = 0.2, max_levels: int = 8,
           report: Callable[[ProbeLevel], None] = lambda lv: None) -> tuple[float | None, list[ProbeLevel]]:
    """Run levels (`run_level(rps)` returns that level's records) until the search settles or
    `max_levels` have run; (capacity, the levels in the order run)."""
    levels: list[ProbeLevel] = []
    while len(levels) < max_levels and (rps := next_rps(levels, start_rps, resolution)) is not None:
        levels.append(judge_level(rps, run_level(rps), slos, judge_from_s))
        report(levels[-1])
    return capacity_rps(levels), levels
