"""The SLO metric, one definition for the server's metrics and the benchmark.

A request attains its SLO iff its TTFT is within its TTFT target and its TPOT (time after the first
token / (tokens - 1)) within its TPOT target: the definition of DistServe, `vllm bench serve
--goodput` and GenAI-Perf. TPOT alone is the AdaServe paper's, kept as a secondary measure."""

from __future__ import annotations


def tpot_seconds(first_token_time: float, last_token_time: float, num_output_tokens: int) -> float | None:
    """Mean time per output token after the first; None for single-token outputs."""
    if num_output_tokens < 2:
        return None
    return (last_token_time - first_token_time) / (num_output_tokens - 1)


def attains(tpot_s: float | None, slo_ms: float) -> bool:
    """A request attains its SLO iff its TPOT is within it (single-token outputs trivially do)."""
    return tpot_s is None or tpot_s * 1e3 <= slo_ms


def attains_ttft(ttft_s: float | None, slo_ms: float) -> bool:
    """The first token came within the TTFT target (no first token: it did not)."""
    return ttft_s is not None and ttft_s * 1e3 <= slo_ms


def attains_both(ttft_s: float | None, tpot_s: float | None, ttft_slo_ms: float, tpot_slo_ms: float) -> bool:
    return attains_ttft(ttft_s, ttft_slo_ms) and attains(tpot_s, tpot_slo_ms)
