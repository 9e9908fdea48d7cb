"""The SLO metric, one definition for the server's metrics and the benchmark.

A request attains its SLO iff its TTFT is within its TTFT target and its TPOT (time after the first
token / (tokens - 1)) within its TPOT target: the definition of DistServe, `vllm bench serve
--goodput` and GenAI-Perf. TPOT alone is the AdaServe paper's, kept as a secondary measure."""

from __future__ import annotations

import math
from dataclasses import dataclass

BEST_EFFORT = "best_effort"  # the class of a request without targets: never refused for a deadline


@dataclass(frozen=True)
class SLO:
    """A request's latency targets: TPOT and TTFT in ms, or a named class of them. The one type every
    entrance (gRPC, OpenAI, in-process) builds, so validation happens here, once. As a request asks:
    numbers win over the class's, and what is left open comes from the server's default class
    (SchedulerConfig.resolve_slo fills it in; the engine holds only resolved ones). `tpot_s`/`ttft_s`
    are the same targets in the engine clock's seconds; a target left open (None once resolved) is inf.
    A request that asks for no target at all, on a server without a default class, is best effort."""

    tpot_ms: float | None = None
    ttft_ms: float | None = None
    slo_class: str | None = None

    def __post_init__(self) -> None:
        for name in ("tpot_ms", "ttft_ms"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v <= 0):
                raise ValueError(f"{name.replace('_ms', '_slo_ms')} must be a positive finite number of ms, got {v!r}")
        if self.slo_class is not None and (not isinstance(self.slo_class, str) or not self.slo_class):
            raise ValueError(f"slo_class must be a non-empty string, got {self.slo_class!r}")

    @property
    def best_effort(self) -> bool:
        return self.tpot_ms is None and self.ttft_ms is None

    @property
    def tpot_s(self) -> float:
        return self.tpot_ms / 1e3 if self.tpot_ms is not None else math.inf

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1e3 if self.ttft_ms is not None else math.inf


def tpot_seconds(first_token_time: float, last_token_time: float, num_output_tokens: int) -> float | None:
    """Mean time per output token after the first; None for single-token outputs."""
    if num_output_tokens < 2:
        return None
    return (last_token_time - first_token_time) / (num_output_tokens - 1)


def attains(tpot_s: float | None, slo_ms: float | None) -> bool:
    """A request attains its SLO iff its TPOT is within it (single-token outputs and requests without
    a TPOT target trivially do)."""
    return tpot_s is None or slo_ms is None or tpot_s * 1e3 <= slo_ms


def attains_ttft(ttft_s: float | None, slo_ms: float | None) -> bool:
    """The first token came within the TTFT target, if any (no first token: it did not)."""
    return ttft_s is not None and (slo_ms is None or ttft_s * 1e3 <= slo_ms)


def attains_both(ttft_s: float | None, tpot_s: float | None, ttft_slo_ms: float, tpot_slo_ms: float) -> bool:
    return attains_ttft(ttft_s, ttft_slo_ms) and attains(tpot_s, tpot_slo_ms)
