"""The hardware roofline: latency flat up to a knee, then linear in the tokens of the batch.

Pure functions: fit from (tokens, latency) measurements, predict, and pick the budget B.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    flat_ms: float  # latency of any batch up to the knee
    knee: int  # tokens where latency starts growing
    slope_ms: float  # extra ms per token beyond the knee

    def predict(self, tokens: int) -> float:
        return self.flat_ms + self.slope_ms * max(0, tokens - self.knee)

    def to_dict(self) -> dict:
        return {"flat_ms": self.flat_ms, "knee": self.knee, "slope_ms": self.slope_ms}


def through_points(points: Sequence[tuple[int, float]], line: Roofline, tokens: int) -> float:
    """Latency of `tokens` piecewise-linear through measured (tokens, ms) points, the roofline's slope
    past the last one; the roofline alone without points. A forward over more tokens never costs less,
    so a point above a later one is noise (a busy moment while profiling) and is lowered to it: left as
    measured, one token would cost more than two and speculating would look cheaper than decoding."""
    if not points:
        return line.predict(tokens)
    xs, ys = _knots(points if isinstance(points, tuple) else tuple(map(tuple, points)))
    if tokens <= xs[0]:
        return ys[0]
    i = bisect.bisect_left(xs, tokens)
    if i < len(xs):
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    return ys[-1] + line.slope_ms * (tokens - xs[-1])


@functools.lru_cache(maxsize=256)
def _knots(points: tuple[tuple[int, float], ...]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The monotone points as sizes and latencies, once per set of points: a scheduler prices every
    iteration several times over with the same few profiles (a third of a simulation's time went to
    lowering the same points again)."""
    low = monotone(points)
    return tuple(x for x, _ in low), tuple(y for _, y in low)


def monotone(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Each latency lowered to the least latency measured at this size or beyond (points sorted by size)."""
    out, low = [], float("inf")
    for x, y in reversed(points):
        low = min(low, y)
        out.append((x, low))
    return out[::-1]


def fit_roofline(tokens: Sequence[int], latency_ms: Sequence[float]) -> Roofline:
    """Least-squares fit of flat-then-linear, trying every measured size as the knee."""
    points = sorted(zip(tokens, latency_ms))
    if not points:
        raise ValueError("no measurements")
    best: tuple[float, Roofline] | None = None
    for k_idx, (knee, _) in enumerate(points):
        flat = [y for x, y in points[: k_idx + 1]]
        flat_ms = sum(flat) / len(flat)
        rest = points[k_idx + 1 :]
        num = sum((x - knee) * (y - flat_ms) for x, y in rest)
        den = sum((x - knee) ** 2 for x, _ in rest)
        slope = max(num / den, 0.0) if den else 0.0
        line = Roofline(flat_ms, knee, slope)
        sse = sum((line.predict(x) - y) ** 2 for x, y in points)
        if best is None or sse < best[0] - 1e-12:
            best = (sse, line)
    assert best is not None
    return best[1]


def pick_budget(line: Roofline, max_slowdown: float = 1.3) -> int:
    """The largest batch whose predicted latency stays within `max_slowdown` x the flat latency: at
    least the knee, so the flat region (free tokens) is always used."""
    extra = (max_slowdown - 1.0) * line.flat_ms / line.slope_ms if line.slope_ms > 0 else 0.0
    return max(1, int(line.knee + extra))
