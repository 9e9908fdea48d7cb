"""When a streamed request's new tokens leave the server: at once, or with the next iteration's.

Each response costs CPU in this process, the server's gRPC frontend and the client; on a small machine
that time comes out of the engine's step (see StreamingConfig). Holding is bounded per request so a
response never leaves later than the configured hold or the request's own TPOT target allows.
"""

from __future__ import annotations

from ..scheduler.estimator import ema

# weight of the newest step in the running estimate of the next step's duration
STEP_EMA = 0.2


def hold_limit_s(max_hold_ms: float, tpot_slo_ms: float) -> float:
    """How long after its oldest token a held response may still wait."""
    limit = min(max_hold_ms, tpot_slo_ms) if tpot_slo_ms > 0 else max_hold_ms
    return limit / 1e3


def must_send(held_since: float, now: float, next_step_s: float, limit_s: float) -> bool:
    """Whether held tokens leave now: waiting one more step would keep the oldest past the limit."""
    return now + next_step_s - held_since > limit_s


def next_step_estimate(previous_s: float | None, measured_s: float) -> float:
    return measured_s if previous_s is None else ema(previous_s, measured_s, STEP_EMA)
