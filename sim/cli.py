"""Command line: a sweep of policies x request rates (x replica counts x routers) on one simulated
deployment, with a progress bar; writes <out>.json (the configuration and one row per run, with the
benchmark's metrics) and <out>.png (attainment, goodput and accepted tokens per verification vs RPS).

    python -m sim --hardware a100x4 --model llama70b \\
        --policies adaserve,continuous,sarathi,spec:4 --rps 1,2,4,8 --duration-s 600 --replicas 1 --router slo
    python -m sim --hardware cpu --policies adaserve,continuous --rps 0.5,1 --duration-s 120

The paper's figures: `python -m sim.paper`; replicas needed: `python -m
sim.scaleout`; predicted vs measured `make bench`: `python -m sim.validate`.
"""

from __future__ import annotations

import argparse
import itertools
import os

from harness.run_dir import run_dir

from .options import add_common, deploy, floats, ints
from .plots import plot_panels
from .report import print_rows, save
from .runs import RunSpec, run_all
from .workload import build_requests


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap)
    ap.add_argument("--policies", default="adaserve,continuous,sarathi,spec:4")
    ap.add_argument("--rps", type=floats, default=[1, 2, 4, 8], help="comma-separated request rates (total)")
    ap.add_argument("--replicas", type=ints, default=[1], help="comma-separated replica counts")
    ap.add_argument("--router", default="slo", help="comma-separated: round_robin, least_loaded, slo")
    ap.add_argument("--out", default=os.path.join(run_dir("sim"), "sweep"),
                    help="output stem: <out>.json and <out>.png")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    policies, routers = args.policies.split(","), args.router.split(",")
    dep = deploy(args)
    first = dep.scenario(policies[0])
    workloads = {rps: build_requests(rps, args.duration_s, first.slos, first.prompt_scale, args.seed, args.arrival,
                                     output_scale=args.output_scale) for rps in args.rps}
    several = len(args.replicas) > 1, len(routers) > 1
    specs = [RunSpec(policy, workloads[rps], {"rps": rps}, replicas, router,
                     " ".join([policy] + ([f"x{replicas}"] if several[0] else []) + ([router] if several[1] else [])))
             for replicas, router, policy, rps in itertools.product(args.replicas, routers, policies, args.rps)]
    rows = run_all(specs, dep.scenario, args.seed, first.name)
    meta = {"scenario": first.name, "slos": first.slos.describe(), "baseline_tpot_ms": first.baseline_tpot_ms,
            "budget": first.cost.profile().budget, "acceptance": first.acceptance.name, "args": vars(args)}
    save(args.out, meta, rows)
    plot_panels(rows, "rps", args.out, f"{first.name}, B = {meta['budget']}")
    print(f"{first.name}: {meta['slos']}; B = {meta['budget']}")
    print_rows(rows, ["rps"])
    print(f"wrote {args.out}.json and {args.out}.png")
