"""The SLO metric, one definition for the server's metrics and the benchmark."""

from __future__ import annotations


def tpot_seconds(first_token_time: float, last_token_time: float, num_output_tokens: int) -> float | None:
    """Mean time per output token after the first; None for single-token outputs."""
    if num_output_tokens < 2:
        return None
    return (last_token_time - first_token_time) / (num_output_tokens - 1)


def attains(tpot_s: float | None, slo_ms: float) -> bool:
    """A request attains its SLO iff its TPOT is within it (single-token outputs trivially do)."""
    return tpot_s is None or tpot_s * 1e3 <= slo_ms
