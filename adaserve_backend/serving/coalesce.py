"""When a streamed request's new tokens leave the server: at once, or with the next iteration's.

Each response costs CPU in this process, the server's gRPC frontend and the client (through the
ensemble also the pipeline model's and a second hop of the server's), and on a small machine that time
comes out of the engine's step (see StreamingConfig). A held token leaves at most the configured hold
after it was made. The first and the last token are never held, so neither the time to first token
nor the time per output token (mean over the request) changes; the gaps between responses do.

Why not also bound the hold by the request's TPOT target (an earlier version did): requests near their
targets then stream nearly every iteration, which is exactly when the engine has no time to spare; its
steps slow down at the same batch and admission turns requests away (evidence:
docs/experiments.md#holds).
"""

from __future__ import annotations

from ..scheduler.decode_estimator import ema

# weight of the newest step in the running estimate of the next step's duration
STEP_EMA = 0.2


def must_send(held_since: float, now: float, next_step_s: float, limit_s: float) -> bool:
    """Whether held tokens leave now: waiting one more step would keep the oldest past `limit_s` (the
    configured hold) after it was made."""
    return now + next_step_s - held_since > limit_s


def next_step_estimate(previous_s: float | None, measured_s: float) -> float:
    return measured_s if previous_s is None else ema(previous_s, measured_s, STEP_EMA)
