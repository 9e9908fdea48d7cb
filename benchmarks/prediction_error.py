"""How far admission's first-token predictions fell from what the engine then measured, read off our
server's `adaserve_ttft_measured_over_predicted` histogram (Prometheus text on Triton's metrics port):
the difference of two scrapes covers the requests that ended in between. The bucket edges sit at
1 -+ each of ERRORS, so the share of predictions within each relative error is exact, and the median
absolute error is interpolated between those shares. The same for the scheduler's output-length
predictions, per SLO class, in tokens."""

from __future__ import annotations

import math
import re

from harness.servers import metrics_text

HISTOGRAM = "adaserve_ttft_measured_over_predicted"
LENGTH_HISTOGRAM = "adaserve_output_length_error_tokens"  # per slo_class
ERRORS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.5)  # |measured / predicted - 1|
_LE = re.compile(r'le="([^"]+)"')
_CLASS = re.compile(r'slo_class="([^"]+)"')


def _by_class(text: str, name: str) -> dict[str, dict[float, float]]:
    """Cumulative counts by upper edge (`le`, +Inf included) of histogram `name`, per `slo_class` label
    ("" for series without one)."""
    out: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket") and (m := _LE.search(line)):
            c = _CLASS.search(line)
            counts = out.setdefault(c.group(1) if c else "", {})
            counts[float(m.group(1))] = counts.get(float(m.group(1)), 0.0) + float(line.rsplit(" ", 1)[-1])
    return out


def _summed(by_class: dict[str, dict[float, float]]) -> dict[float, float]:
    counts: dict[float, float] = {}
    for per_class in by_class.values():
        for le, c in per_class.items():
            counts[le] = counts.get(le, 0.0) + c
    return counts


def histogram_buckets(metrics_url: str, name: str = HISTOGRAM) -> dict[float, float] | None:
    """Cumulative counts by upper edge (`le`, +Inf included), summed over labels; None if the endpoint
    does not answer."""
    text = metrics_text(metrics_url)
    return None if text is None else _summed(_by_class(text, name))


def class_buckets(metrics_url: str, name: str = LENGTH_HISTOGRAM) -> dict[str, dict[float, float]] | None:
    """histogram_buckets per `slo_class` label."""
    text = metrics_text(metrics_url)
    return None if text is None else {c: v for c, v in _by_class(text, name).items() if c}


def length_errors(before: dict | None, after: dict | None) -> dict[str, dict] | None:
    """Per SLO class: how many outputs, and the median |predicted - actual| length in tokens (Prometheus'
    interpolation within the histogram's power-of-two buckets), over the requests between two scrapes."""
    if before is None or after is None:
        return None
    out = {}
    for cls, counts in after.items():
        diff = {le: c - before.get(cls, {}).get(le, 0.0) for le, c in counts.items()}
        n = diff.get(math.inf, 0.0)
        if n > 0:
            out[cls] = {"n": int(n), "median_abs_error_tokens": _quantile(diff, n, 0.5)}
    return out


def _edge(counts: dict[float, float], x: float) -> float | None:
    return next((counts[le] for le in counts if math.isclose(le, x, abs_tol=1e-9)), None)


def prediction_error(before: dict[float, float] | None, after: dict[float, float] | None) -> dict | None:
    """`n` predictions, the share within each relative error, the median absolute relative error
    (None when fewer than half are within the largest of ERRORS) and the median of measured / predicted
    (above 1: predictions too optimistic). None without both scrapes or without a prediction between."""
    if before is None or after is None:
        return None
    counts = {le: c - before.get(le, 0.0) for le, c in after.items()}
    n = counts.get(math.inf, 0.0)
    if n <= 0:
        return None
    within = {}
    for e in ERRORS:
        hi, lo = _edge(counts, 1 + e), _edge(counts, 1 - e)
        if hi is not None and lo is not None:
            within[e] = (hi - lo) / n
    median_error, prev_e, prev_w = None, 0.0, 0.0
    for e, w in within.items():
        if w >= 0.5:
            median_error = prev_e + (0.5 - prev_w) / (w - prev_w) * (e - prev_e) if w > prev_w else e
            break
        prev_e, prev_w = e, w
    return {"n": int(n), "within": {f"{e:.0%}": round(w, 3) for e, w in within.items()},
            "median_abs_error": median_error, "median_ratio": _quantile(counts, n, 0.5)}


def _quantile(counts: dict[float, float], n: float, q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th observation."""
    edges = sorted(counts)
    prev_le, prev_c = 0.0, 0.0
    for le in edges:
        if counts[le] >= q * n:
            if math.isinf(le):
                return prev_le
            return prev_le + (q * n - prev_c) / (counts[le] - prev_c) * (le - prev_le) if counts[le] > prev_c else le
        prev_le, prev_c = le, counts[le]
    return None


def describe(err: dict | None) -> str:
    if not err:
        return "no first-token predictions"
    median = "> 50%" if err["median_abs_error"] is None else f"{err['median_abs_error']:.0%}"
    return (f"first-token predictions: median |error| {median}, within 15% {err['within'].get('15%', 0):.0%} "
            f"of {err['n']}, measured/predicted p50 {err['median_ratio']:.2f}")


def scrape(metrics_url: str) -> dict:
    """Both prediction histograms from one read of the endpoint (None each where it does not answer)."""
    if (text := metrics_text(metrics_url)) is None:
        return {"ttft": None, "lengths": None}
    lengths = _by_class(text, LENGTH_HISTOGRAM)
    return {"ttft": _summed(_by_class(text, HISTOGRAM)), "lengths": {c: v for c, v in lengths.items() if c}}


def errors_between(before: dict, after: dict) -> dict:
    """Row fields for the requests that ended between two scrapes."""
    return {"ttft_prediction": prediction_error(before["ttft"], after["ttft"]),
            "length_prediction": length_errors(before["lengths"], after["lengths"])}


def describe_lengths(err: dict | None) -> str:
    if not err:
        return "no output-length predictions"
    return "output-length predictions, median |error| in tokens: " + ", ".join(
        f"{cls} {e['median_abs_error_tokens']:.0f} of {e['n']}" for cls, e in sorted(err.items())
        if e["median_abs_error_tokens"] is not None)
