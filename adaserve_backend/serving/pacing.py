"""When each token of a paced stream leaves: one response per token, spaced at the pace the request's
tokens are made, each held at most a share of its TPOT target.

Speculation makes a request's tokens in bursts (every verification accepts several), and an iteration
that carries a prefill chunk is longer than the others. Sent as made, a stream moves in jumps: a
client measuring the gaps between responses (the inter-token latency `vllm bench serve` reports) sees
a step's length per response rather than the time per token, and a long step as a stall. Paced, the
tokens of a step leave one by one, each an interval after the previous one, the interval the request's
measured time per token: what a burst of tokens holds back carries the stream through the next step.
No token waits longer than `HOLD_SHARE` of its request's TPOT target after it was made, the first token
never waits (TTFT unchanged), and the last leaves with whatever is still held when the request ends,
at once (so the client's time per output token, first to last, is unchanged too).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..scheduler.decode_estimator import ema

# A token is held at most this share of its request's TPOT target: the stream is never held back as
# long as the pace its request asked for.
HOLD_SHARE = 0.9
# weight of the newest output in the estimate of a request's time per token
PACE_EMA = 0.3


@dataclass
class StreamPace:
    """One request's stream: how fast its tokens are made, and when its last response leaves."""

    hold_s: float  # the longest a token waits after it was made
    interval_s: float | None = None  # time per token, as this request's tokens are made (EMA)
    last_made: float | None = None  # when its newest output was made
    last_release: float | None = None  # when its latest response is due to leave

    @classmethod
    def for_target(cls, tpot_s: float) -> StreamPace:
        return cls(hold_s=HOLD_SHARE * tpot_s)

    def release_times(self, made: float, pieces: int, tokens: int) -> list[float]:
        """When each of `pieces` responses, carrying between them the `tokens` of an output made at
        `made`, leaves: an interval after the one before, never before it was made nor past the hold."""
        if self.last_made is not None and tokens > 0:
            per_token = (made - self.last_made) / tokens
            self.interval_s = per_token if self.interval_s is None else ema(self.interval_s, per_token, PACE_EMA)
        self.last_made = made
        per_piece = (self.interval_s or 0.0) * tokens / max(pieces, 1)
        times = []
        for _ in range(pieces):
            due = made if self.last_release is None else max(self.last_release + per_piece, made)
            self.last_release = min(due, made + self.hold_s)
            times.append(self.last_release)
        return times
