"""SLO-aware admission: whether a waiting request may start without putting the running ones off their
TPOT targets, and which best-effort request one with targets displaces."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .slo_slack import on_track

if TYPE_CHECKING:
    from ..config import SchedulerConfig
    from ..sequence import Sequence


def keeps_slos(seq: Sequence, running: list[Sequence], est, config: SchedulerConfig, now: float) -> bool:
    """Whether, with `seq` running too (beside `running`), every running request that can still make its
    SLO (at the time per token of a lone request) is on track for it, and so is `seq` unless it cannot be (its
    TPOT target is below a lone request's, or its first-token deadline is already given up: holding
    it back would make it wait for nothing). One that fell behind blocks admissions until it has
    caught up: letting others in because it is behind anyway would make it, and those after it, miss.
    One too far behind to catch up still keeps its pace: no admission slows the batch below its
    target rate (without this, a few late requests let the batch grow until every TPOT collapsed;
    evidence: docs/scheduling.md#admission). The time per token after admitting counts what
    arriving requests' prefill chunks add to decode iterations: under load most iterations carry
    one, and predicting decode alone lets the batch grow until the chunks push it to the tightest
    class's target (evidence: docs/architecture.md#the-model-runtime).
    A request whose target even one companion breaks holds admissions for config.exclusive_hold_s at
    most: after that it no longer does (bounded starvation; its own target may then be missed)."""
    best = est.best_tpot_at(1)
    after = est.tpot_at(len(running) + 1) * est.ride_along * config.admission_headroom
    if not (on_track(seq, now, after) or seq.slo_missed or not on_track(seq, now, best)):
        return False
    pair = est.best_tpot_at(2) * est.ride_along * config.admission_headroom

    def held_too_long(s: Sequence) -> bool:
        return s.planned_tpot_s < pair and now - (s.admitted_time or now) >= config.exclusive_hold_s

    return all(on_track(s, now, after)
               or (not on_track(s, now, best) and (s.planned_tpot_s < best or after <= s.planned_tpot_s))
               for s in running if not held_too_long(s))


def best_effort_victim(seq: Sequence, running: list[Sequence]) -> Sequence | None:
    """The running best-effort request (no targets) that `seq`, which has targets, displaces when it
    does not fit: the newest, which has the least work to redo. None if there is none to displace."""
    victims = [s for s in running if s.slo.best_effort]
    return max(victims, key=lambda s: s.arrival) if victims and not seq.slo.best_effort else None
