"""Command line: a sweep of policies x request rates (x replica counts x routers) on one simulated
deployment, with a progress bar; writes <out>.json (the configuration and one row per run, with the
benchmark's metrics) and <out>.png (attainment, goodput and accepted tokens per verification vs RPS,
the benchmark's plot).

    python -m adaserve_backend.sim --hardware a100x4 --model llama70b \\
        --policies adaserve,continuous,sarathi,spec:4 --rps 1,2,4,8 --duration-s 600 --replicas 1 --router slo
    python -m adaserve_backend.sim --hardware cpu --policies adaserve,continuous --rps 0.5,1 --duration-s 120
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

from tqdm import tqdm

from .scenario import scenario
from .simulator import SimConfig, simulate
from .workload import build_requests


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m adaserve_backend.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default="a100x4", help="cpu, a100xN or h100xN (N: tensor-parallel GPUs per replica)")
    ap.add_argument("--model", default="llama70b", choices=["llama70b", "qwen32b"], help="target and its draft (GPU only)")
    ap.add_argument("--policies", default="adaserve,continuous,sarathi,spec:4")
    ap.add_argument("--rps", type=floats, default=[1, 2, 4, 8], help="comma-separated request rates (total)")
    ap.add_argument("--duration-s", type=float, default=600.0, help="simulated seconds of arrivals")
    ap.add_argument("--replicas", type=ints, default=[1], help="comma-separated replica counts")
    ap.add_argument("--router", default="slo", help="comma-separated: round_robin, least_loaded, slo")
    ap.add_argument("--arrival", default="poisson", choices=["poisson", "gamma", "fluctuating"])
    ap.add_argument("--acceptance", default=None, help="llama70b-1b, qwen32b-05b, engine or a JSON table (default: the model's)")
    ap.add_argument("--output-scale", type=float, default=1.0, help="scales the benchmark's output length ranges")
    ap.add_argument("--max-slowdown", type=float, default=1.3,
                    help="GPU budget B: the largest verification within this x the flat latency (as tools.profile)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/sim/sweep", help="output stem: <out>.json and <out>.png")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    policies, routers = args.policies.split(","), args.router.split(",")
    runs = list(itertools.product(args.replicas, routers, policies, args.rps))
    first = scenario(args.hardware, args.model, policies[0], args.acceptance, args.max_slowdown)
    workloads = {rps: build_requests(rps, args.duration_s, first.slos, first.prompt_scale, args.seed, args.arrival,
                                     output_scale=args.output_scale) for rps in args.rps}
    label_parts = [len(args.replicas) > 1, len(routers) > 1]
    rows = []
    bar = tqdm(total=sum(len(workloads[r]) for *_, r in runs), desc=first.name, unit="req")
    for replicas, router, policy, rps in runs:
        sc = scenario(args.hardware, args.model, policy, args.acceptance, args.max_slowdown)
        bar.set_postfix_str(f"{policy} {rps:g} rps x{replicas} {router}")
        wall = time.monotonic()
        res = simulate(SimConfig(sc.replica, sc.cost, sc.acceptance, replicas, router, args.seed), workloads[rps], bar.update)
        label = " ".join([policy] + ([f"x{replicas}"] if label_parts[0] else []) + ([router] if label_parts[1] else []))
        rows.append({"policy": label, "scheduler_policy": policy, "rps": rps, "replicas": replicas, "router": router,
                     **res.summary(), "wall_s": time.monotonic() - wall})
    bar.close()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    meta = {"scenario": first.name, "slos": first.slos.describe(), "baseline_tpot_ms": first.baseline_tpot_ms,
            "budget": first.cost.profile().budget, "acceptance": first.acceptance.name, "args": vars(args)}
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    from client.plots import plot_sweep

    plot_sweep(rows, "rps", args.out)
    print(f"{first.name}: {meta['slos']}; B = {meta['budget']}")
    print(f"{'policy':>22} {'rps':>5} {'attain':>6} {'tpot-only':>9} {'goodput':>8} {'acc/verify':>10} {'TPOT p50':>8} {'wall s':>6}")
    for r in rows:
        print(f"{r['policy']:>22} {r['rps']:5g} {r['slo_attainment']:6.3f} {r['tpot_slo_attainment']:9.3f} "
              f"{r['goodput_tok_s']:8.1f} {r['mean_accepted_per_verify']:10.2f} {r['tpot_ms_p50'] or 0:8.1f} {r['wall_s']:6.1f}")
    print(f"wrote {args.out}.json and {args.out}.png")
