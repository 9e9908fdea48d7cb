"""Which CPU kernel serves the bfloat16 products, measured on this machine at startup.

csrc/decoder_layer.cpp's `packed_linear` serves a product with the pair kernel (pair_gemm.h), AMX tiles
(amx_gemm.h, where the CPU has them) or oneDNN's prepacked op. Which is fastest at which row count is
a property of the CPU: without AMX the pair kernel wins at every count; on an AMX Xeon oneDNN won
above 8-16 rows, and a crossover fixed on one CPU made a 16-token tree cost more than 32 tokens on the
other (docs/architecture.md#the-model-runtime). So nothing is fixed: each plan below is timed here, on one of
the model's own products, and the one with the smallest worst slowdown against the best kernel at any
measured row count is taken.

Under `batch_invariant` (the default) only plans that serve every row count with one kernel compete, so
that a row's numbers never depend on its batch: the pair kernel everywhere, or AMX tiles everywhere.
Otherwise the pair kernel up to a measured crossover and oneDNN above it competes too.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field

import torch

from ..config.kernels import KernelConfig
from .linear import Linear, kernels

log = logging.getLogger("adaserve")

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ALL_ROWS = sys.maxsize  # pair_rows meaning "every row count"


@dataclass(frozen=True)
class KernelChoice:
    plan: str  # "pairs", "amx" or "pairs+onednn"
    pair_rows: int  # products of up to this many rows take the pair kernel (ALL_ROWS: all); larger, oneDNN
    amx: bool  # AMX tiles serve every row count
    timings: dict[str, dict[int, float]] = field(default_factory=dict)  # kernel -> rows -> ms, as measured

    @property
    def batch_invariant(self) -> bool:
        return self.pair_rows == ALL_ROWS

    def cost(self, rows: int) -> float:
        """Measured ms of the representative product at a measured row count under this plan."""
        kernel = "amx" if self.amx else "pairs" if rows <= self.pair_rows else "onednn"
        return self.timings[kernel][rows]

    def describe(self) -> str:
        limit = "every row count" if self.batch_invariant else f"up to {self.pair_rows} rows, oneDNN above"
        if not self.timings:
            return f"{self.plan} ({limit}; not measured)"
        at = {r: round(self.cost(r), 3) for r in self.timings["pairs"]}
        return f"{self.plan} ({limit}); ms by rows: {at}"


DEFAULT = KernelChoice("pairs", ALL_ROWS, False)


def representative(model: torch.nn.Module) -> Linear | None:
    """The model's widest decoder product packed for both the pair kernel and oneDNN, or None (float32,
    GGUF blocks, a GPU: nothing to choose)."""
    layers = getattr(model, "layers", None)
    if not layers:
        return None
    layer = layers[0].gate_up_proj
    ok = isinstance(layer, Linear) and layer._pairs is not None and layer._packed is not None
    return layer if ok and layer._blocks is None else None


def _best_ms(fn, repeats: int = 5, calls: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def amx_agrees(ops, layer: Linear) -> bool:
    """AMX tiles give the pair kernel's numbers up to the order of float32 sums (a check that a kernel
    never run on this CPU before computes the product it should)."""
    x = torch.randn(37, layer.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    got, ref = ops.amx_linear(x, layer._pairs, layer.bias).float(), ops.pair_linear(x, layer._pairs, layer.bias).float()
    return bool(torch.allclose(got, ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max())))


def measure(ops, layer: Linear, rows=ROWS) -> dict[str, dict[int, float]]:
    x_of = {m: torch.randn(m, layer.in_features).bfloat16() for m in rows}
    kernels_to_time = {
        "pairs": lambda x: ops.pair_linear(x, layer._pairs, layer.bias),
        "onednn": lambda x: torch.ops.mkldnn._linear_pointwise(x, layer._packed, layer.bias, "none", [], ""),
    }
    if ops.amx_compiled and ops.amx_permitted() and layer.in_features % 32 == 0:
        if amx_agrees(ops, layer):
            kernels_to_time["amx"] = lambda x: ops.amx_linear(x, layer._pairs, layer.bias)
        else:
            log.warning("kernels: AMX tiles disagree with the pair kernel on this CPU; not used")
    with torch.inference_mode():
        return {name: {m: _best_ms(lambda: fn(x_of[m])) for m in rows} for name, fn in kernels_to_time.items()}


def crossover(timings: dict[str, dict[int, float]]) -> int:
    """The largest measured row count up to which the pair kernel is at least as fast as oneDNN at every
    count, when oneDNN is faster at every larger one; ALL_ROWS when the pair kernel never loses for good."""
    pairs, onednn = timings["pairs"], timings["onednn"]
    counts = sorted(pairs)
    for i, m in enumerate(counts):
        if all(onednn[n] < pairs[n] for n in counts[i:]):
            return counts[i - 1] if i else 0
    return ALL_ROWS


def plans(timings: dict[str, dict[int, float]], batch_invariant: bool) -> list[KernelChoice]:
    out = [KernelChoice("pairs", ALL_ROWS, False, timings)]
    if "amx" in timings:
        out.append(KernelChoice("amx", ALL_ROWS, True, timings))
    if not batch_invariant and (cut := crossover(timings)) != ALL_ROWS:
        out.append(KernelChoice("pairs+onednn", cut, False, timings))
    return out


def worst_slowdown(plan: KernelChoice) -> float:
    counts = plan.timings["pairs"]
    return max(plan.cost(m) / min(t[m] for t in plan.timings.values()) for m in counts)


def choose(timings: dict[str, dict[int, float]], batch_invariant: bool) -> KernelChoice:
    return min(plans(timings, batch_invariant), key=worst_slowdown)  # ties: the first, the pair kernel


def apply(model: torch.nn.Module, config: KernelConfig) -> KernelChoice | None:
    """Measure (per `config`), set the kernels' choice for the whole process and return it; None where the
    model runs no bfloat16 product the choice applies to."""
    ops = kernels()
    layer = representative(model) if ops is not None else None
    if layer is None:
        return None
    choice = choose(measure(ops, layer), config.batch_invariant) if config.measure else DEFAULT
    ops.set_kernel_choice(choice.pair_rows, choice.amx)
    log.info("kernels: %s", choice.describe())
    return choice
