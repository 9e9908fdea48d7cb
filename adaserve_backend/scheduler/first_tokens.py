"""Admission's view of first tokens: how much prefill an iteration carries, which waiting requests can
no longer have their first token by its deadline (they get the overload answer at once), which ones a
burst holds back so that more of its first tokens come in time, and what admission predicts for the
requests it starts. Pure decisions over the queues the scheduler owns; the scheduler applies them."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .deadlines import (
    arrival_order_on_time,
    deferred_in_burst,
    edf_key,
    missed,
    note_prefill_times,
    order_by_arrival,
    predict_first_tokens,
)
from .prefill_pacing import prefill_budget, split_chunks
from .prefix import note_cached_prefixes

if TYPE_CHECKING:
    from ..config import SchedulerConfig
    from ..kv_cache import BlockManager
    from ..sequence import Sequence
    from .policies import Policy
    from .prefill_estimator import Estimator

Missed = list[tuple["Sequence", float]]  # a request and when its first token would come


def prefill_view(running: list[Sequence]) -> tuple[int, list[Sequence]]:
    """Decoding requests (what prefill rides along) and the running requests still prefilling."""
    return sum(s.decoding for s in running), [s for s in running if not s.decoding]


class FirstTokenGate:
    def __init__(self, config: SchedulerConfig, policy: Policy, estimator: Estimator, slo_admission: bool,
                 target_blocks: BlockManager, draft_blocks: BlockManager | None) -> None:
        self.config, self.policy, self.estimator, self.slo_admission = config, policy, estimator, slo_admission
        self.target_blocks, self.draft_blocks = target_blocks, draft_blocks

    def prefill_cap(self, num_decode: int) -> int:
        """Prefill tokens an iteration beside `num_decode` decoding requests may carry."""
        return self.policy.prefill_cap(self.config, num_decode)

    def prefill_budget(self, prefill, decode, depth, width, now) -> int:
        """Prefill tokens this iteration carries: SLO-aware pacing with admission, else the cap."""
        cap = self.prefill_cap(len(decode))
        if self.slo_admission and prefill:
            return prefill_budget(prefill, decode, depth, width, now, self.estimator, cap, self.config.spare_decodes,
                                  self.config.eager_prefill, self.config.prefill_within_tpot)
        return cap

    def chunks(self, prefill, decode, depth, width, now) -> dict[Sequence, int]:
        """SLO-aware prefill takes first tokens in deadline order; the rest in the running queue's."""
        order = sorted(prefill, key=edf_key) if self.slo_admission else prefill
        return split_chunks(order, self.prefill_budget(prefill, decode, depth, width, now))

    def unreachable(self, waiting: deque[Sequence], running: list[Sequence],
                    now: float) -> tuple[deque[Sequence], Missed]:
        """The waiting queue in EDF order (edf_key: deadlines and each prompt's own prefill time, what
        the caches hold for it skipped; arrival order where that keeps every deadline, if the config
        asks for it), and the requests whose first token would be late even if they
        started now, behind only the running prefills due before them: past saving."""
        note_cached_prefixes(waiting, self.target_blocks, self.draft_blocks)
        n, prefilling = prefill_view(running)
        if self.estimator.cost is not None:
            note_prefill_times(waiting, self.estimator, self.prefill_cap(0))
            if (within := self.config.arrival_order_within) is not None:
                on = arrival_order_on_time(waiting, prefilling, self.estimator, now, n, self.prefill_cap(n), within)
                order_by_arrival(waiting, prefilling, on)
        waiting = deque(sorted(waiting, key=edf_key))
        return waiting, missed(waiting, self.estimator, now, n, prefilling, self.prefill_cap(n))

    def deferred(self, waiting: deque[Sequence], running: list[Sequence], now: float) -> set[Sequence]:
        """Those a burst holds back (deadlines.deferred_in_burst), if the config asks for it."""
        if not self.config.burst_deferral:
            return set()
        n, prefilling = prefill_view(running)
        return deferred_in_burst(waiting, self.estimator, now, n, prefilling, self.prefill_cap(n))

    def late_after_next(self, waiting: deque[Sequence], running: list[Sequence], now: float) -> Missed:
        """A request not admitted now waits at least one more iteration; if that already makes its
        first token late, no admissible schedule meets its deadline."""
        n, prefilling = prefill_view(running)
        return missed(waiting, self.estimator, now, n, prefilling, self.prefill_cap(n), after_next=True)

    def predict(self, started: list[Sequence], running: list[Sequence], now: float) -> None:
        """What admission expects for starting requests' first tokens, once this step's admissions are
        all in, at this step's prefill budget (deadlines.predict_first_tokens); the predictor's error is
        measured against it: EngineMetrics."""
        est = self.estimator
        if est.cost is not None:
            n, prefilling = prefill_view(running)
            decode = [s for s in running if s.decoding]
            chunk = max(1, self.prefill_budget(prefilling, decode, *(est.depth_width(n) if n else (0, 0)), now))
            predict_first_tokens(started, n, prefilling, now, est, chunk)
