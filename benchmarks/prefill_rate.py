"""The machine's peak prefill rate R (prompt tokens per second), measured in process on the served
target model: what the prefill-only bound (harness/prefill_bound.py) assumes a machine can do.

The target is loaded as the model repository's engine.json serves it (checkpoint, dtype, KV cache),
prompts of 128, 256 and 512 tokens are prefilled from an empty cache as benchmarks/forward_latency.py
measures one (median of `repeats`), and R is the fastest of the three: the bound must not assume a rate
slower than some prompt length could reach. The model is freed before any server starts, so the
measurement takes nothing from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SIZES = (128, 256, 512)


@dataclass(frozen=True)
class PrefillRate:
    tok_s: float  # R: the fastest of `per_size`
    per_size: dict[int, float] = field(default_factory=dict)  # prompt tokens -> tokens/s
    dtype: str = ""
    cpu: str = ""
    measured: bool = True  # False: given on the command line (--prefill-rate)

    def to_dict(self) -> dict:
        return {"tok_s": self.tok_s, "per_size": {str(n): r for n, r in self.per_size.items()},
                "dtype": self.dtype, "cpu": self.cpu, "measured": self.measured}


def given_rate(tok_s: float) -> PrefillRate:
    from harness.machine import cpu_model

    if tok_s <= 0:
        raise ValueError(f"--prefill-rate must be positive, got {tok_s}")
    return PrefillRate(tok_s, cpu=cpu_model(), measured=False)


def rate_from_ms(ms: dict[int, float]) -> dict[int, float]:
    """Prompt tokens -> tokens/s, from each size's prefill time in ms."""
    return {n: n / (t / 1e3) for n, t in ms.items()}


def measure_prefill_rate(sizes: Sequence[int] = SIZES, repeats: int = 5) -> PrefillRate:
    """Load the served target (its kernels chosen as the server chooses them), time an n-token prefill
    for each of `sizes`, free the model."""
    from benchmarks.forward_latency import measure_prefill
    from benchmarks.served_target import on_served_target
    from harness.machine import cpu_model

    def measure(cfg, runner) -> dict[int, float]:
        if max(sizes) > runner.max_len:
            raise ValueError(f"a {max(sizes)}-token prefill exceeds the served max_model_len {runner.max_len}")
        return rate_from_ms({n: measure_prefill(runner, n, repeats) for n in sizes})

    cfg, per_size = on_served_target(measure)
    return PrefillRate(max(per_size.values()), per_size, cfg.target.dtype, cpu_model())


def describe(rate: PrefillRate) -> str:
    if not rate.measured:
        return f"peak prefill rate R = {rate.tok_s:.0f} tok/s (given)"
    sizes = ", ".join(f"{n}: {r:.0f}" for n, r in rate.per_size.items())
    return f"peak prefill rate R = {rate.tok_s:.0f} tok/s ({rate.dtype}; tokens/s per prompt length {sizes})"
