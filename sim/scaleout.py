"""Scale-out: how many replicas a load needs for a joint-attainment target, per router.

    python -m sim.scaleout                 # make sim-scaleout: 4, 16, 64 rps x 3 routers
    python -m sim.scaleout --rps 16 --routers slo --policy spec:4

For each load and router: the smallest replica count whose run attains `--target` (joint), found by
doubling from a first guess and then bisecting, on the assumption that attainment does not fall with
more replicas. Writes <out>.json (the table and every run) and <out>.png (replicas needed; attainment
against replicas). Runs are shorter than the figures' (two simulated minutes by default): a search
makes several per cell, and the largest are 64 rps over tens of replicas.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

from tqdm import tqdm

from harness.run_dir import run_dir

from .options import add_common, deploy, floats
from .plots import plot_scaleout
from .report import save
from .runs import RunSpec, run_all
from .workload import build_requests

ROUTERS = ("round_robin", "least_loaded", "slo")
RPS_PER_REPLICA_GUESS = 4.0  # the first guess only; the search corrects it either way


def fewest(attains: Callable[[int], bool], guess: int, limit: int) -> int | None:
    """The smallest n in [1, limit] with attains(n), for attains monotone in n; None if even `limit` fails."""
    lo, hi, n = 0, None, max(1, min(guess, limit))  # attains(lo) is false (or lo = 0); attains(hi) is true
    while hi is None:
        if attains(n):
            hi = n
        elif n >= limit:
            return None
        else:
            lo, n = n, min(2 * n, limit)
    if lo == 0 and hi > 1:  # the guess held: look below it too, halving
        n = hi // 2
        while n >= 1 and attains(n):
            hi, n = n, n // 2
        lo = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if attains(mid) else (mid, hi)
    return hi


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sim.scaleout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, slo_mode="relative", arrival="azure", duration_s=120.0)
    ap.add_argument("--rps", type=floats, default=[4, 16, 64])
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--policy", default="adaserve")
    ap.add_argument("--target", type=float, default=0.9, help="joint attainment to reach")
    ap.add_argument("--max-replicas", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(run_dir("sim-scaleout"), "scaleout"), help="output stem")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    dep = deploy(args)
    sc = dep.scenario(args.policy)
    routers = args.routers.split(",")
    runs: list[dict] = []
    needed: dict[str, dict[float, int | None]] = {r: {} for r in routers}
    bar = tqdm(total=len(routers) * len(args.rps), desc=f"{sc.name} scale-out", unit="search")
    for rps in args.rps:
        reqs = build_requests(rps, args.duration_s, sc.slos, sc.prompt_scale, args.seed,
                              args.arrival, None, args.output_scale)
        for router in routers:
            seen: dict[int, float] = {}

            def attains(n: int) -> bool:
                if n not in seen:
                    bar.set_postfix_str(f"{rps:g} rps {router} x{n}")
                    row = run_all([RunSpec(args.policy, reqs, {"rps": rps}, n, router)], dep.scenario,
                                  args.seed, leave=False)[0]
                    runs.append(row)
                    seen[n] = row["slo_attainment"]
                return seen[n] >= args.target

            needed[router][rps] = fewest(attains, math.ceil(rps / RPS_PER_REPLICA_GUESS), args.max_replicas)
            bar.update(1)
    bar.close()
    table = [{"rps": rps, "router": r, "replicas": needed[r][rps],
              "attainment": next((x["slo_attainment"] for x in runs if x["rps"] == rps and x["router"] == r
                                  and x["replicas"] == needed[r][rps]), None)} for rps in args.rps for r in routers]
    meta = {"scenario": sc.name, "policy": args.policy, "target": args.target, "slos": sc.slos.describe(),
            "budget": sc.cost.profile().budget, "args": vars(args)}
    save(args.out, meta, runs, table=table)
    plot_scaleout(needed, runs, args.out,
                  f"{sc.name} {args.policy}: replicas for >= {args.target:.0%} joint attainment")
    print(f"{sc.name} {args.policy}, {args.arrival} arrivals, {args.duration_s:g} s: {meta['slos']}")
    print(f"{'rps':>6} " + " ".join(f"{r:>14}" for r in routers))
    for rps in args.rps:
        cells = [needed[r][rps] if needed[r][rps] is not None else ">" + str(args.max_replicas) for r in routers]
        print(f"{rps:6g} " + " ".join(f"{c:>14}" for c in cells))
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
