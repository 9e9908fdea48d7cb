"""A `make gpu-check` run's layer measurements as the GPU cost model reads them, and the efficiency fitted
to them (gpu_cost.EFFICIENCY's H100 entry; hardware.H100's peaks are the run's measured ones).

The check times a few Llama-3.1-8B decoder layers (one GPU, TP1, random bf16 weights) per forward, for 1
to 2,048 tokens and each attention backend, and estimates a whole forward: 32 layers, the output head,
the attention plan. It runs them eagerly, without CUDA graphs: a layer's ~20 kernel launches from Python
take the host longer than the GPU's work up to a few hundred tokens per forward, so those points time the
host, not the GPU. A served engine replays CUDA graphs for decode (adaserve_backend/cuda_graphs/decode.py),
which take that floor away, so the fit leaves them out and uses only the compute-bound points: those
whose FLOPs alone, at the measured matmul peak, take the GPU longer per layer than the batch-1 decode's
whole measured layer (the launch floor). The cost model has one efficiency for memory and compute
alike, so the memory-bound (decode) side is priced with this compute-bound fit, unchecked, until a
check with CUDA graphs measures decode on the next lease.

The fit is to the served backend's points (FlashInfer, which the engine picks for a bf16 cache on CUDA:
adaserve_backend/attention/backend.py); the others are printed beside it.

    python -m sim.gpu_measured runs/gpu-check/DATE/gpu-check.json [--fixture sim/gpu_check_h100.json]

`--fixture` writes the few numbers the fit reads (runs/ is not in git): FIXTURE is the copy the shipped
constants come from.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, replace

from .gpu_cost import EFFICIENCY, forward_s
from .hardware import H100, H100_SHEET, Gpu, ModelShape

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_check_h100.json")
SERVED_BACKEND = "flashinfer"
POINT_FIELDS = ("name", "backend", "requests", "tokens", "context", "layer_ms", "est_forward_ms")


@dataclass(frozen=True)
class LayerPoint:
    """One timed forward shape: `requests` of `tokens` new tokens in all over `context` cached tokens each
    (0: a prefill), scaled by the check to a whole forward."""

    name: str
    backend: str
    requests: int
    tokens: int
    context: int
    layer_ms: float
    forward_ms: float

    @property
    def prefill(self) -> bool:
        return self.context == 0  # the check's only points without a cache are its prefills

    @property
    def logit_rows(self) -> int:
        """Rows the check's head multiplies (tools/gpu/points.logit_rows): a prefill's last, else all."""
        return self.requests if self.prefill else self.tokens

    @property
    def attended(self) -> int:
        """Query-key pairs: a prefill's causal triangle; a tree's or decode's tokens each over the cache and
        itself (the tree's own ancestors, a few per token, are under 0.2% of such a forward's FLOPs)."""
        if self.prefill:
            n = self.tokens // self.requests
            return self.requests * n * (n + 1) // 2
        return self.tokens * (self.context + 1)


@dataclass(frozen=True)
class GpuCheck:
    device: str
    started: str
    copy_bytes_s: float
    matmul_flops_s: float
    model: ModelShape
    points: tuple[LayerPoint, ...]


def load(path: str = FIXTURE) -> GpuCheck:
    """A gpu-check.json (or the fixture, the same keys); points that were skipped or failed are dropped."""
    with open(path) as f:
        run = json.load(f)
    layers = run["layers"]
    s = layers["shape"]
    model = ModelShape("Llama-3.1-8B (gpu-check)", s["layers"], s["hidden"], s["heads"], s["kv_heads"],
                       s["head_dim"], s["intermediate"], s["vocab"])
    points = tuple(LayerPoint(p["name"], p["backend"], p["requests"], p["tokens"], p["context"], p["layer_ms"],
                              p["est_forward_ms"]) for p in layers["points"] if "est_forward_ms" in p)
    m = layers["measured"]
    return GpuCheck(run["env"]["device"], run["started"], m["copy_tb_s"] * 1e12, m["bf16_matmul_tflops"] * 1e12,
                    model, points)


def fixture(path: str) -> dict:
    """The few numbers of a gpu-check.json that `load` reads."""
    with open(path) as f:
        run = json.load(f)
    layers = run["layers"]
    return {"source": path, "started": run["started"], "env": {"device": run["env"]["device"]},
            "layers": {"shape": layers["shape"], "measured": layers["measured"],
                       "points": [{k: p[k] for k in POINT_FIELDS} for p in layers["points"]
                                  if "est_forward_ms" in p]}}


def measured_gpu(check: GpuCheck, base: Gpu = H100_SHEET) -> Gpu:
    """`base` with the check's peaks: what the model divides by (the link and memory size stay `base`'s)."""
    return replace(base, name=H100.name, hbm_bytes_s=check.copy_bytes_s, flops_s=check.matmul_flops_s)


def predicted_ms(gpu: Gpu, check: GpuCheck, p: LayerPoint, efficiency: float) -> float:
    """The cost model's price of the point's whole forward, TP1."""
    return forward_s(gpu, check.model, 1, p.tokens, p.requests * p.context, p.attended, efficiency,
                     p.logit_rows) * 1e3


def layer_flops(model: ModelShape, p: LayerPoint) -> float:
    per_layer_params = (model.matmul_params - model.head_params) / model.layers
    return 2 * per_layer_params * p.tokens + 4 * model.heads * model.head_dim * p.attended


def launch_floor_ms(check: GpuCheck, backend: str) -> float:
    """The backend's batch-1 decode layer: one token's layer, whose GPU work is a third of it or less."""
    return min((p for p in check.points if p.backend == backend), key=lambda p: (p.tokens, p.layer_ms)).layer_ms


def compute_bound(check: GpuCheck, backend: str = SERVED_BACKEND) -> list[LayerPoint]:
    """The backend's points whose layer FLOPs, at the measured peak, outlast the launch floor."""
    floor = launch_floor_ms(check, backend)
    return [p for p in check.points
            if p.backend == backend and layer_flops(check.model, p) / check.matmul_flops_s * 1e3 > floor]


def fit_efficiency(gpu: Gpu, check: GpuCheck, points: list[LayerPoint]) -> float:
    """The efficiency minimising the largest relative error over `points` (gpu_cost.calibrate's grid)."""
    if not points:
        raise ValueError("no compute-bound points to fit")

    def worst(e: float) -> float:
        return max(abs(predicted_ms(gpu, check, p, e) / p.forward_ms - 1) for p in points)

    return min((e / 1000 for e in range(20, 1001)), key=worst)


def report(check: GpuCheck) -> str:
    gpu = measured_gpu(check)
    fitted = compute_bound(check)
    e = fit_efficiency(gpu, check, fitted)
    old = EFFICIENCY[H100_SHEET.name]
    fit_keys = {(p.name, p.backend) for p in fitted}
    bound_keys = {(p.name, p.backend) for b in {p.backend for p in check.points} for p in compute_bound(check, b)}
    lines = [f"{check.device}, {check.started}: copy {check.copy_bytes_s / 1e12:.3f} TB/s, bf16 matmul "
             f"{check.matmul_flops_s / 1e12:.1f} TFLOP/s (sheet {H100_SHEET.hbm_bytes_s / 1e12:.2f} TB/s, "
             f"{H100_SHEET.flops_s / 1e12:.0f} TFLOP/s)",
             f"efficiency fitted to {SERVED_BACKEND}'s {len(fitted)} compute-bound points: {e:.3f} "
             f"(shipped {EFFICIENCY[H100.name]:.3f}; the sheet preset's {old:.2f})",
             f"{'point':>28} {'backend':>10} {'tokens':>6} {'measured':>9} {'model':>7} {'err':>6} "
             f"{'sheet@' + format(old, '.2f'):>10} {'err':>6}  bound"]
    for p in check.points:
        key = (p.name, p.backend)
        new, was = predicted_ms(gpu, check, p, e), predicted_ms(H100_SHEET, check, p, old)
        bound = "compute (fit)" if key in fit_keys else "compute" if key in bound_keys else "launch (excluded)"
        lines.append(f"{p.name:>28} {p.backend:>10} {p.tokens:6d} {p.forward_ms:9.2f} {new:7.2f} "
                     f"{new / p.forward_ms - 1:+6.1%} {was:10.2f} {was / p.forward_ms - 1:+6.1%}  {bound}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sim.gpu_measured", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="?", default=FIXTURE, help="a gpu-check.json (default: the fixture)")
    ap.add_argument("--fixture", help="write the numbers the fit reads here")
    args = ap.parse_args(argv)
    print(report(load(args.run)))
    if args.fixture:
        with open(args.fixture, "w") as f:
            json.dump(fixture(args.run), f, indent=1)
            f.write("\n")
        print(f"wrote {args.fixture}")


if __name__ == "__main__":
    main()
