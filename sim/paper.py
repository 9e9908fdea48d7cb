"""The paper's evaluation (Section 6.2) on a simulated deployment: Figures 7-8 (attainment and goodput
against RPS), the urgent-share sweep (Figure 9) and the SLO-scale sweep (Figure 10), each compared
with the paper's headline ratios over the best baseline.

    python -m sim.paper rps             # make sim-fig78
    python -m sim.paper urgent_share    # make sim-urgent
    python -m sim.paper slo_scale       # make sim-slo-scale

Writes <out>/paper-<sweep>.json and .png. Defaults: Llama-3.1-70B TP4 on 4x A100, Azure-like arrivals,
the paper's 60/20/20 mix and TPOT targets in proportion to the baseline (see workload.paper_slos).
A ratio is AdaServe over the best baseline at that point (attainment, goodput) or the best baseline's
violations over AdaServe's; each is given for joint attainment (TTFT and TPOT) and for the paper's
TPOT-only one.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass

from harness.run_dir import run_dir

from .options import add_common, deploy, floats
from .plots import plot_panels
from .report import print_rows, save
from .runs import RunSpec, run_all
from .workload import DEFAULT_MIX, build_requests, paper_slos

SWEEPS = ("rps", "urgent_share", "slo_scale")
X_KEY = {"rps": "rps", "urgent_share": "urgent_share", "slo_scale": "urgent_slo_scale"}
# The paper's Llama-3.1-70B claims (Section 6.2): at the highest RPS for Figures 7-8, "up to" over a sweep
# otherwise (the SLO-scale figures are the best of its two models).
PAPER = {
    "rps": {"attainment_x": 2.1, "goodput_x": 1.9, "fewer_violations_x": 4.3},
    "urgent_share": {"goodput_x": 1.30, "fewer_violations_x": 4.3},
    "slo_scale": {"goodput_x": 1.38, "fewer_violations_x": 4.61},
}
AT_RPS = 4.0  # the paper fixes 4 rps for both sweeps
URGENT_SHARES = (0.2, 0.4, 0.6, 0.8)
SLO_SCALES = (0.8, 1.0, 1.2, 1.6, 2.0)  # coding TPOT target over the baseline TPOT (the paper's "SLO scale")


@dataclass(frozen=True)
class Ratios:
    """AdaServe against the best baseline at one point of a sweep."""

    level: float
    best_baseline: str  # by attainment
    attainment_x: float
    goodput_x: float
    fewer_violations_x: float
    tpot_attainment_x: float
    tpot_goodput_x: float
    tpot_fewer_violations_x: float


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else 1.0)


def compare(rows: list[dict], x_key: str, ours: str = "adaserve") -> list[Ratios]:
    out = []
    for level in sorted({r[x_key] for r in rows}):
        at = [r for r in rows if r[x_key] == level]
        mine = next((r for r in at if r["policy"] == ours), None)
        base = [r for r in at if r["policy"] != ours]
        if mine is None or not base:
            continue
        best = max(base, key=lambda r: r["slo_attainment"])
        top = lambda key: max(r[key] for r in base)  # noqa: E731
        low = lambda key: min(r[key] for r in base)  # noqa: E731
        out.append(Ratios(level, best["policy"], _div(mine["slo_attainment"], top("slo_attainment")),
                          _div(mine["goodput_tok_s"], top("goodput_tok_s")),
                          _div(low("violations"), mine["violations"]),
                          _div(mine["tpot_slo_attainment"], top("tpot_slo_attainment")),
                          _div(mine["tpot_goodput_tok_s"], top("tpot_goodput_tok_s")),
                          _div(low("tpot_violations"), mine["tpot_violations"])))
    return out


def workloads(sweep: str, args: argparse.Namespace, baseline_ms: float, prompt_scale: str) -> list[tuple[dict, list]]:
    """(label, requests) per point of `sweep`, from the benchmark's generators."""
    def reqs(rps: float, mix=None, coding_scale: float = 1.2):
        slos = paper_slos(baseline_ms, mode=args.slo_mode, coding_scale=coding_scale)
        return build_requests(rps, args.duration_s, slos, prompt_scale, args.seed, args.arrival, mix, args.output_scale)

    if sweep == "rps":
        return [({"rps": rps}, reqs(rps)) for rps in args.rps]
    if sweep == "urgent_share":
        return [({"rps": args.at_rps, "urgent_share": u},
                 reqs(args.at_rps, {"coding": u, "chat": (1 - u) / 2, "summary": (1 - u) / 2}))
                for u in URGENT_SHARES]
    return [({"rps": args.at_rps, "urgent_slo_scale": s}, reqs(args.at_rps, dict(DEFAULT_MIX), s)) for s in SLO_SCALES]


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sim.paper", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", choices=SWEEPS)
    add_common(ap, slo_mode="relative", arrival="azure")
    ap.add_argument("--policies", default="adaserve,continuous,sarathi,spec:2,spec:4,spec:6")
    ap.add_argument("--rps", type=floats, default=[1, 2, 3, 4, 5, 6], help="Figures 7-8's request rates")
    ap.add_argument("--at-rps", type=float, default=AT_RPS, help="the request rate of the two sweeps")
    ap.add_argument("--out", default=run_dir("sim-paper"), help="output directory")
    ap.add_argument("--tag", default="", help="appended to the output names (paper-<sweep><tag>)")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    dep = deploy(args)
    first = dep.scenario("adaserve")
    points = workloads(args.sweep, args, first.baseline_tpot_ms, first.prompt_scale)
    specs = [RunSpec(p, reqs, label) for p in args.policies.split(",") for label, reqs in points]
    rows = run_all(specs, dep.scenario, args.seed, f"{first.name} {args.sweep}")
    ratios = compare(rows, X_KEY[args.sweep])
    stem = os.path.join(args.out, f"paper-{args.sweep}{args.tag}")
    budget = first.cost.profile().budget
    meta = {"scenario": first.name, "sweep": args.sweep, "slos": first.slos.describe(),
            "baseline_tpot_ms": first.baseline_tpot_ms,
            "budget": budget, "acceptance": first.acceptance.name,
            "paper_llama70b": PAPER[args.sweep], "args": vars(args)}
    save(stem, meta, rows, ratios=[asdict(r) for r in ratios])
    plot_panels(rows, X_KEY[args.sweep], stem,
                f"{first.name}, {args.arrival} arrivals, {args.slo_mode} SLOs, B = {budget}")
    print(f"{first.name}: {meta['slos']}; baseline TPOT {first.baseline_tpot_ms:.1f} ms; B = {budget}")
    print_rows(rows, list(dict.fromkeys(["rps", X_KEY[args.sweep]])))
    print_ratios(ratios, X_KEY[args.sweep], PAPER[args.sweep])
    print(f"wrote {stem}.json and {stem}.png")


def print_ratios(ratios: list[Ratios], x_key: str, paper: dict) -> None:
    print(f"adaserve over the best baseline (paper, Llama-70B: {', '.join(f'{k} {v}' for k, v in paper.items())})")
    columns = f"{'attain x':>8} {'goodput x':>9} {'fewer viol x':>12}"
    print(f"{x_key:>16} {'best':>10} {columns} | TPOT-only: {columns}")
    for r in ratios:
        print(f"{r.level:16g} {r.best_baseline:>10} {r.attainment_x:8.2f} {r.goodput_x:9.2f} "
              f"{r.fewer_violations_x:12.2f} |"
              f" {'':>10} {r.tpot_attainment_x:8.2f} {r.tpot_goodput_x:9.2f} {r.tpot_fewer_violations_x:12.2f}")


if __name__ == "__main__":
    main()
