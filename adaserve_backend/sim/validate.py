"""The simulator against a measured `make bench` run: the same workload, policies and load levels on
this CPU's cost model, predicted next to measured joint and TPOT-only attainment and TPOT p50.

    make bench && make sim-validate                        # results/quick-rps.json
    python -m adaserve_backend.sim.validate results/quick-rps.json [--seed 0 --output-scale 0.5 --time-limit 90]

The workload is rebuilt as client.bench builds it (Poisson arrivals of int(rps * duration) requests,
client.workload.build_workload with the benchmark's prompts, seed and output scale; the urgent-share
and SLO-scale sweeps' mixes and targets), and each prompt is encoded with the served tokenizer as
client.bench.InProcess does, so prompt lengths are the measured run's. The bench JSON does not record
its --seed, --output-scale and --time-limit: pass them if the run changed them (defaults are bench's).
Target steps are priced by a fit to the bench's own iterations, every run's but the one predicted
(`--step-cost in-run`, the default when every run recorded its iterations, as client.bench does now), or by the profile's
synthetic sweep (`--step-cost profile`); the draft's forwards by the profile's roofline. Times are scaled by the speed the
machine had during each measured run (its `speed_probe_ms`: the profile's own forwards timed either side
of the run, tools.profiler.probe_ms in client.bench; `--no-speed` prices every run at the profile's speed), acceptance
from `--acceptance` (default: the engine's recorded table). The issue's bar: attainment within 0.05 and
TPOT p50 within 10% at every level. Writes <out>.json and <out>.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
from dataclasses import asdict, dataclass

from client.workload import build_workload, builtin_prompts, poisson_arrivals
from client.slo_targets import SloTargets

from ..cost_model.cost_model import CostModel
from ..cost_model.step_cost import EngineStepCost
from .plots import plot_panels
from .report import save
from .runs import RunSpec, run_all
from .scenario import scenario
from .workload import SimRequest

SWEEP_KEYS = ("urgent_share", "urgent_slo_scale")  # a bench row's level besides rps
ATTAINMENT_TOLERANCE = 0.05
TPOT_TOLERANCE = 0.10


@dataclass(frozen=True)
class Check:
    policy: str
    level: dict
    measured_joint: float
    predicted_joint: float
    measured_tpot_only: float
    predicted_tpot_only: float
    measured_tpot_p50_ms: float | None
    predicted_tpot_p50_ms: float | None

    @property
    def tpot_p50_error(self) -> float | None:
        if not self.measured_tpot_p50_ms or self.predicted_tpot_p50_ms is None:
            return None
        return self.predicted_tpot_p50_ms / self.measured_tpot_p50_ms - 1

    @property
    def within(self) -> bool:
        err = self.tpot_p50_error
        return (abs(self.predicted_joint - self.measured_joint) <= ATTAINMENT_TOLERANCE
                and abs(self.predicted_tpot_only - self.measured_tpot_only) <= ATTAINMENT_TOLERANCE
                and (err is None or abs(err) <= TPOT_TOLERANCE))


def level_of(row: dict) -> dict:
    return {"rps": row["rps"], **{k: row[k] for k in SWEEP_KEYS if k in row}}


def bench_items(level: dict, duration_s: float, slos: SloTargets, prompts, seed: int, output_scale: float):
    """client.bench's items for one level (its items_for, which is local to its main)."""
    rps, u, s = level["rps"], level.get("urgent_share"), level.get("urgent_slo_scale")
    mix = {"coding": u, "chat": (1 - u) / 2, "summary": (1 - u) / 2} if u is not None else None
    arrivals = poisson_arrivals(rps, max(1, int(rps * duration_s)), random.Random(seed))
    return build_workload(arrivals, slos.with_tpot_scale({"coding": s} if s is not None else {}), mix=mix,
                          prompts=prompts, seed=seed, output_scale=output_scale)


def sim_requests(items, encode) -> list[SimRequest]:
    return [SimRequest(it.request_id, it.category, len(encode(it)), it.max_tokens, it.tpot_slo_ms, it.ttft_slo_ms, it.arrival_s)
            for it in items]


def held_out_step(measured: list[dict], speeds: list[float], i: int, profile: CostModel, fallback: EngineStepCost | None) -> EngineStepCost:
    """The step cost fitted to every measured run's iterations but run i's own (each run's times divided by
    its machine speed), so no run is priced by what it measured itself; the draft's forwards keep the
    profile's roofline (EngineStepCost.from_iterations)."""
    records = [{**r, "spec_ms": r["spec_ms"] / s, "step_ms": r["step_ms"] / s}
               for j, (row, s) in enumerate(zip(measured, speeds)) if j != i for r in row.get("iterations", [])]
    if not records:
        raise SystemExit("--step-cost in-run needs a bench run that recorded its iterations (a client.bench row's "
                         "`iterations`) in more than one run; pass --step-cost profile for older results")
    return EngineStepCost.from_iterations(records, profile.draft_step_ms, fallback)


def compare(measured: list[dict], predicted: list[dict]) -> list[Check]:
    out = []
    for m in measured:
        p = next(r for r in predicted if r["policy"] == m["policy"] and level_of(r) == level_of(m))
        out.append(Check(m["policy"], level_of(m), m["slo_attainment"], p["slo_attainment"], m["tpot_slo_attainment"],
                         p["tpot_slo_attainment"], m.get("tpot_ms_p50"), p.get("tpot_ms_p50")))
    return out


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m adaserve_backend.sim.validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json", help="a client.bench result (results/<suite>-<sweep>.json), in-process target")
    ap.add_argument("--seed", type=int, default=0, help="the bench run's --seed")
    ap.add_argument("--output-scale", type=float, default=0.5, help="the bench run's --output-scale")
    ap.add_argument("--time-limit", type=float, default=90.0, help="the bench run's --time-limit (s)")
    ap.add_argument("--acceptance", default="engine", help="acceptance model (sim/acceptance.py)")
    ap.add_argument("--no-speed", action="store_true", help="ignore the runs' speed probes (price them at the profile's speed)")
    ap.add_argument("--step-cost", choices=["auto", "in-run", "profile"], default="auto",
                    help="price target steps with a fit to the bench's other runs' iterations or the profile's sweep; "
                         "auto: in-run if every run recorded its iterations")
    ap.add_argument("--policies", default="", help="only these policies (comma-separated; default: the run's)")
    ap.add_argument("--out", default="", help="output stem (default results/sim/validate-<bench name>)")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    with open(args.bench_json) as f:
        bench = json.load(f)
    if bench.get("target", "inprocess") != "inprocess" or bench.get("sweep") == "fluctuating":
        raise SystemExit("validate compares in-process rps / urgent_share / slo_scale sweeps only")
    from adaserve_backend.config import EngineConfig
    from client.bench import InProcess

    config_path = bench.get("config", "model_repository/adaserve/1/engine.json")
    config = EngineConfig.from_json(config_path)
    encode = InProcess(config).encode  # the tokenizer only, no model
    slos = SloTargets(**bench["slo_targets"])
    keep = set(filter(None, args.policies.split(",")))
    measured = [r for r in bench["rows"] if not keep or r["policy"] in keep]
    levels = list({json.dumps(level_of(r), sort_keys=True): level_of(r) for r in measured}.values())
    prompts = builtin_prompts()
    workloads = {json.dumps(lv, sort_keys=True): sim_requests(bench_items(lv, bench["duration_s"], slos, prompts, args.seed,
                                                                          args.output_scale), encode) for lv in levels}
    specs = [RunSpec(r["policy"], workloads[json.dumps(level_of(r), sort_keys=True)], level_of(r)) for r in measured]
    for r, s in zip(measured, specs):
        if r.get("requests") not in (None, len(s.requests)):
            raise SystemExit(f"{r['policy']} {level_of(r)}: the bench sent {r['requests']} requests, the rebuilt workload has "
                             f"{len(s.requests)}: pass the run's --seed / duration")
    profile = CostModel.load(config.speculation.profile_path)
    speeds = [1.0 if args.no_speed else profile.relative_speed(r.get("speed_probe_ms") or {}) for r in measured]
    print("machine speed per run (x profile):", " ".join(f"{r['policy']}@{r['rps']:g}={v:.2f}" for r, v in zip(measured, speeds)))
    fallback = EngineStepCost.from_profile(config.speculation.profile_path)
    in_run = args.step_cost == "in-run" or (args.step_cost == "auto" and len(measured) > 1 and all(r.get("iterations") for r in measured))
    print("target steps priced by", "a fit to the other runs' iterations" if in_run else "the profile's step fit")
    predicted = []
    for i, (spec, speed) in enumerate(zip(specs, speeds)):  # one run each: each is priced for its own speed
        step = held_out_step(measured, speeds, i, profile, fallback) if in_run else None

        def deploy(policy, speed=speed, step=step):
            sc = scenario("cpu", policy=policy, acceptance=args.acceptance, engine_json=config_path, cpu_speed=speed)
            return sc if step is None else dataclasses.replace(sc, cost=dataclasses.replace(sc.cost, step=step))
        (row,) = run_all([spec], deploy, args.seed, "cpu vs bench", drain_s=max(0.0, args.time_limit - bench["duration_s"]), leave=False)
        predicted.append({**row, "machine_speed": speed})
    checks = compare(measured, predicted)
    stem = args.out or os.path.join("results", "sim", "validate-" + os.path.splitext(os.path.basename(args.bench_json))[0])
    save(stem, {"bench_json": args.bench_json, "args": vars(args), "step_cost": "in-run" if in_run else "profile"}, predicted,
         checks=[{**asdict(c), "tpot_p50_error": c.tpot_p50_error, "within": c.within} for c in checks])
    x_key = next((k for k in SWEEP_KEYS if k in measured[0]), "rps")
    both = [{**r, "policy": f"{r['policy']} sim"} for r in predicted] + [{**r, "policy": f"{r['policy']} bench"} for r in measured]
    plot_panels(both, x_key, stem, f"simulated (CPU cost model) vs measured: {args.bench_json}")
    print_checks(checks)
    print(f"{sum(c.within for c in checks)}/{len(checks)} within the bar (attainment +-{ATTAINMENT_TOLERANCE}, TPOT p50 +-{TPOT_TOLERANCE:.0%})")
    print(f"wrote {stem}.json and {stem}.png")


def print_checks(checks: list[Check]) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"{'policy':>12} {'level':>28} {'joint meas/sim':>15} {'tpot-only meas/sim':>19} {'TPOT p50 ms meas/sim':>21} ok")
    for c in checks:
        level = " ".join(f"{k}={v:g}" for k, v in c.level.items())
        print(f"{c.policy:>12} {level:>28} {c.measured_joint:7.2f}/{c.predicted_joint:<7.2f} "
              f"{c.measured_tpot_only:9.2f}/{c.predicted_tpot_only:<9.2f} {fmt(c.measured_tpot_p50_ms):>10}/{fmt(c.predicted_tpot_p50_ms):<10} "
              f"{'yes' if c.within else 'no'}")


if __name__ == "__main__":
    main()
