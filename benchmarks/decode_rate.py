"""The machine's peak decode rate D (output tokens per second), measured in process on the served target
model: what the decode-aware bound (harness/decode_ceiling.py) charges each output token after the first.

D must not understate what the served engine can do, or the bound would charge decode too much and stop
being a bound. Each output token but the last is fed to the target once, however it was drafted: its
keys and values are the next token's context. So a request's n - 1 decode tokens occupy at least n - 1
positions of target forwards (rejected drafts only add more), plain decoding or speculative, and the
target's cheapest time per position bounds an output token's cost from below, whatever speculation
accepts; the draft model's own time only adds to it. D is that: the most positions per second over the
forward shapes the engine runs over cached contexts, decode batches (one position a sequence) up to
the scheduler's `max_num_seqs` and verification trees (TREE positions a sequence) up to its
`token_budget`, each sequence over a short context (CONTEXT tokens: shorter than a chat prompt, so
attention is cheap).

The target is loaded as the model repository's engine.json serves it (checkpoint, dtype, KV cache,
threads), as benchmarks/prefill_rate.py loads it for R, and freed before any server starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

CONTEXT = 32  # cached tokens per sequence
TREE = 8  # positions per sequence in a verification, as the cost model's calibration measures them


@dataclass(frozen=True)
class DecodeRate:
    tok_s: float  # D: the fastest of `per_shape`
    per_shape: dict[str, float] = field(default_factory=dict)  # "SEQSxPOSITIONS" -> positions per second
    context: int = CONTEXT
    dtype: str = ""
    cpu: str = ""
    measured: bool = True  # False: given on the command line (--decode-rate)

    def to_dict(self) -> dict:
        return {"tok_s": self.tok_s, "per_shape": dict(self.per_shape), "context": self.context,
                "dtype": self.dtype, "cpu": self.cpu, "measured": self.measured}


def given_rate(tok_s: float) -> DecodeRate:
    from harness.machine import cpu_model

    if tok_s <= 0:
        raise ValueError(f"--decode-rate must be positive, got {tok_s}")
    return DecodeRate(tok_s, cpu=cpu_model(), measured=False)


def shapes(max_num_seqs: int, token_budget: int) -> dict[int, list[int]]:
    """Positions per sequence -> positions per forward to time: decode batches of 1, 8 and 16
    sequences and the scheduler's most, verification trees of 1, 8 and 16 sequences and as many as
    the token budget holds (at most max_num_seqs), each no larger than those limits allow."""
    decode = sorted({n for n in (1, 8, 16, max_num_seqs) if n <= max_num_seqs})
    trees = min(max_num_seqs, token_budget // TREE)
    tree = sorted({s * TREE for s in (1, 8, 16, trees) if 1 <= s <= trees})
    return {1: decode, TREE: tree} if tree else {1: decode}


def rate_from_ms(per_seq: int, ms: dict[int, float]) -> dict[str, float]:
    """Positions per forward -> ms, as "SEQSxPOSITIONS" -> positions per second."""
    return {f"{-(-n // per_seq)}x{per_seq}": n / (t / 1e3) for n, t in ms.items()}


def measure_decode_rate(repeats: int = 5, context: int = CONTEXT) -> DecodeRate:
    """Load the served target (its kernels chosen as the server chooses them), time each shape's forward
    (adaserve_backend.profiler.measure_forward: median of `repeats` after a warm-up, rolled back each
    time), free the model."""
    from adaserve_backend.profiler import measure_forward
    from benchmarks.served_target import on_served_target
    from harness.machine import cpu_model

    def measure(cfg, runner) -> dict[str, float]:
        per_shape = {}
        for per_seq, sizes in shapes(cfg.scheduler.max_num_seqs, cfg.scheduler.token_budget).items():
            sizes = _fitting(runner, sizes, per_seq, context)
            if sizes:
                per_shape |= rate_from_ms(per_seq, measure_forward(runner, sizes, per_seq, context, repeats,
                                                                   desc=f"decode rate, {per_seq} a sequence"))
        return per_shape

    cfg, per_shape = on_served_target(measure)
    if not per_shape:
        raise RuntimeError("the served KV cache holds no decode batch to time")
    return DecodeRate(max(per_shape.values()), per_shape, context, cfg.target.dtype, cpu_model())


def _fitting(runner, sizes: Sequence[int], per_seq: int, context: int) -> list[int]:
    """The sizes whose sequences the KV cache has room for (measure_forward reserves them all at once)."""
    room = runner.blocks.num_free_blocks // runner.blocks.blocks_for(context + per_seq)
    return [n for n in sizes if -(-n // per_seq) <= room]


def describe(rate: DecodeRate) -> str:
    if not rate.measured:
        return f"peak decode rate D = {rate.tok_s:.0f} tok/s (given)"
    shapes_ = ", ".join(f"{s}: {r:.0f}" for s, r in rate.per_shape.items())
    return (f"peak decode rate D = {rate.tok_s:.0f} tok/s ({rate.dtype}; positions/s per sequences x positions "
            f"over {rate.context}-token contexts: {shapes_})")
