"""When a streamed request's new tokens leave the server: at once, or with the next iteration's.

Each response costs CPU in this process, the server's gRPC frontend and the client (through the
ensemble also the pipeline model's and a second hop of the server's), and on a small machine that time
comes out of the engine's step (see StreamingConfig). A held token leaves at most the configured hold
after it was made. The first and the last token are never held, so neither the time to first token
nor the time per output token (mean over the request) changes; the gaps between responses do.

A request with a TPOT target is also never left without a response for longer than that target: a
reader watching its stream sees it move at least at the pace it asked for, and the gaps between
responses (the inter-token latency a client measures) stay within it. Bounding the hold by the
*age of the oldest held token* instead let the gaps grow to the hold plus a step; bounding it by the
target through the ensemble (two hops a response) cost the engine its steps under load
(docs/triton.md#decoupled-streaming); the OpenAI frontend now calls the scheduler model directly, one hop.
"""

from __future__ import annotations

import math

from ..scheduler.decode_estimator import ema

# weight of the newest step in the running estimate of the next step's duration
STEP_EMA = 0.2


def must_send(held_since: float, now: float, next_step_s: float, limit_s: float,
              last_sent: float | None = None, gap_s: float = math.inf) -> bool:
    """Whether held tokens leave now: waiting one more step would keep the oldest past `limit_s` (the
    configured hold) after it was made, or the request's stream silent past `gap_s` (its TPOT target)
    since its last response, sent at `last_sent`."""
    after_next = now + next_step_s
    if after_next - held_since > limit_s:
        return True
    return last_sent is not None and after_next - last_sent > gap_s


def next_step_estimate(previous_s: float | None, measured_s: float) -> float:
    return measured_s if previous_s is None else ema(previous_s, measured_s, STEP_EMA)
