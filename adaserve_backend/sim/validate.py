"""The simulator against a measured `make bench` run: the same workload, policies and load levels on
this CPU's cost model, predicted next to measured joint and TPOT-only attainment and TPOT p50.

    make bench && make sim-validate                        # results/quick-rps.json
    python -m adaserve_backend.sim.validate results/quick-rps.json [--seed 0 --output-scale 0.5 --time-limit 90]
    python -m adaserve_backend.sim.validate B.json --fit-from A.json --repeat A.json   # A: an earlier run

The workload is rebuilt as client.bench builds it (Poisson arrivals of int(rps * duration) requests,
client.workload.build_workload with the benchmark's prompts, seed and output scale; the urgent-share
and SLO-scale sweeps' mixes and targets), and each prompt is encoded with the served tokenizer as
client.bench.InProcess does, so prompt lengths are the measured run's; a prompt ends where the measured
runs saw the model stop it (their `outputs`), else at max_tokens. The bench JSON does not record
its --seed, --output-scale and --time-limit: pass them if the run changed them (defaults are bench's).
Target steps are priced by a fit to other runs' recorded iterations: `--fit-from` benches (a calibration
run on this machine; none of the validated bench's own measurements then price it), else every run of
this bench but the one predicted (`--step-cost in-run`, the default when every run recorded its
iterations), or by the profile's synthetic sweep (`--step-cost profile`); the draft's forwards by the
profile's roofline. Times are scaled by the speed the machine had during each measured run (its
`speed_probe_ms`: the profile's own forwards timed either side of the run, tools.profiler.probe_ms in
client.bench; `--no-speed` prices every run at the profile's speed), acceptance from `--acceptance`
(default: the engine's recorded table). The issue's bar: attainment within 0.05 and TPOT p50 within 10%
at every level. `--repeat` judges another measured run of the same bench by the same bar, as if it were
the prediction: what the bar means on a machine whose runs differ from each other. Writes <out>.json
and <out>.png.
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
SPEED_MOVED = 1.2  # a run whose speed probes before and after differ by more: one speed cannot price it
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


def sim_requests(items, encode, stops: dict | None = None) -> list[SimRequest]:
    """`stops`: (prompt, chat) -> the output token at which the served model ended it (stop_lengths)."""
    stops = stops or {}
    return [SimRequest(it.request_id, it.category, len(encode(it)), it.max_tokens, it.tpot_slo_ms, it.ttft_slo_ms, it.arrival_s,
                       stop if (stop := stops.get((it.prompt, it.chat))) is not None and stop <= it.max_tokens else None)
            for it in items]


def stop_lengths(measured: list[dict], items_of) -> dict:
    """Where the served model ended each prompt with its end of sequence, from every measured run's
    `outputs` (client.bench: request id -> [output tokens, finish reason]): (prompt, chat) -> the median
    stop length. Which token ends a prompt is the workload's (greedy decoding of that prompt), not the
    serving policy's, so every run's stops apply to all; a prompt never seen to stop runs to max_tokens."""
    seen: dict[tuple, list[int]] = {}
    for row in measured:
        by_id = {it.request_id: it for it in items_of(level_of(row))}
        for rid, (n, reason) in row.get("outputs", {}).items():
            if reason == "stop" and rid in by_id:
                seen.setdefault((by_id[rid].prompt, by_id[rid].chat), []).append(n)
    return {k: sorted(v)[len(v) // 2] for k, v in seen.items()}


def step_fit(runs: list[dict], speeds: list[float], profile: CostModel, fallback: EngineStepCost | None) -> EngineStepCost:
    """The step cost fitted to `runs`' recorded iterations (each run's times divided by its machine
    speed); the draft's forwards keep the profile's roofline (EngineStepCost.from_iterations)."""
    records = [{**r, "spec_ms": r["spec_ms"] / s, "step_ms": r["step_ms"] / s} for row, s in zip(runs, speeds) for r in row.get("iterations", [])]
    if not records:
        raise SystemExit("in-run step pricing needs bench runs that recorded their iterations (a client.bench row's "
                         "`iterations`) in more than one run; pass --step-cost profile for older results")
    return EngineStepCost.from_iterations(records, profile.draft_step_ms, fallback)


def held_out_step(measured: list[dict], speeds: list[float], i: int, profile: CostModel, fallback: EngineStepCost | None) -> EngineStepCost:
    """The step cost fitted to every measured run's iterations but run i's own, so no run is priced by
    what it measured itself."""
    others = [j for j in range(len(measured)) if j != i]
    return step_fit([measured[j] for j in others], [speeds[j] for j in others], profile, fallback)


def speed_moved(row: dict) -> bool:
    before, after = (row.get("speed_probes_ms") or [{}, {}])
    return any(max(before[k], after[k]) > SPEED_MOVED * min(before[k], after[k]) for k in before if k in after)


def run_speed(profile: CostModel, row: dict) -> float:
    """A bench run's machine speed over the profile's, from its speed probe (1 without one)."""
    return profile.relative_speed(row.get("speed_probe_ms") or {})


def same_run(rows: list[dict], m: dict) -> dict:
    """The row of `rows` with measured run `m`'s policy and level."""
    return next(r for r in rows if r["policy"] == m["policy"] and level_of(r) == level_of(m))


def compare(measured: list[dict], predicted: list[dict]) -> list[Check]:
    out = []
    for m in measured:
        p = same_run(predicted, m)
        out.append(Check(m["policy"], level_of(m), m["slo_attainment"], p["slo_attainment"], m["tpot_slo_attainment"],
                         p["tpot_slo_attainment"], m.get("tpot_ms_p50"), p.get("tpot_ms_p50")))
    return out


def speed_matched(measured: list[dict], other: list[dict], profile: CostModel) -> list[dict]:
    """Another measured run's rows with their TPOT p50 scaled from its machine speed to each measured
    run's (both by their speed probes), as the simulation is priced for each run's speed."""
    out = []
    for m in measured:
        o = same_run(other, m)
        tpot = o.get("tpot_ms_p50")
        out.append({**o, "tpot_ms_p50": tpot and tpot * run_speed(profile, m) / run_speed(profile, o)})
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
    ap.add_argument("--fit-from", nargs="+", default=[], metavar="BENCH_JSON",
                    help="price target steps by a fit to these other bench runs' iterations (a calibration run on this "
                         "machine) instead of the validated bench's: none of its own measurements then price it")
    ap.add_argument("--repeat", default="", metavar="BENCH_JSON",
                    help="another run of the same bench, judged by the same bar as a prediction of this one: how close "
                         "the measured system comes to itself from run to run (the bar's noise floor on this machine)")
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
    items = {json.dumps(lv, sort_keys=True): bench_items(lv, bench["duration_s"], slos, prompts, args.seed, args.output_scale) for lv in levels}
    stops = stop_lengths(measured, lambda lv: items[json.dumps(lv, sort_keys=True)])
    if stops:
        print(f"{len(stops)} prompts end where the measured runs stopped them; the others run to max_tokens")
    workloads = {key: sim_requests(its, encode, stops) for key, its in items.items()}
    specs = [RunSpec(r["policy"], workloads[json.dumps(level_of(r), sort_keys=True)], level_of(r)) for r in measured]
    for r, s in zip(measured, specs):
        if r.get("requests") not in (None, len(s.requests)):
            raise SystemExit(f"{r['policy']} {level_of(r)}: the bench sent {r['requests']} requests, the rebuilt workload has "
                             f"{len(s.requests)}: pass the run's --seed / duration")
    profile = CostModel.load(config.speculation.profile_path)
    speeds = [1.0 if args.no_speed else run_speed(profile, r) for r in measured]
    print("machine speed per run (x profile; ! where its probes before and after differ by more than "
          f"{SPEED_MOVED - 1:.0%}):", " ".join(f"{r['policy']}@{r['rps']:g}={v:.2f}{'!' * speed_moved(r)}" for r, v in zip(measured, speeds)))
    fallback = EngineStepCost.from_profile(config.speculation.profile_path)
    in_run = args.step_cost == "in-run" or (args.step_cost == "auto" and len(measured) > 1 and all(r.get("iterations") for r in measured))
    calibration = None
    if args.fit_from:
        runs = [r for path in args.fit_from for r in json.load(open(path))["rows"]]
        calibration = step_fit(runs, [run_speed(profile, r) for r in runs], profile, fallback)
    print("target steps priced by", "a fit to " + ", ".join(args.fit_from) if calibration else
          "a fit to the other runs' iterations" if in_run else "the profile's step fit")
    predicted = []
    for i, (spec, speed) in enumerate(zip(specs, speeds)):  # one run each: each is priced for its own speed
        step = calibration or (held_out_step(measured, speeds, i, profile, fallback) if in_run else None)

        def deploy(policy, speed=speed, step=step):
            sc = scenario("cpu", policy=policy, acceptance=args.acceptance, engine_json=config_path, cpu_speed=speed)
            return sc if step is None else dataclasses.replace(sc, cost=dataclasses.replace(sc.cost, step=step))
        (row,) = run_all([spec], deploy, args.seed, "cpu vs bench", drain_s=max(0.0, args.time_limit - bench["duration_s"]), leave=False)
        predicted.append({**row, "machine_speed": speed})
    checks = compare(measured, predicted)
    repeat = [r for r in json.load(open(args.repeat))["rows"] if not keep or r["policy"] in keep] if args.repeat else []
    repeat_checks = compare(measured, speed_matched(measured, repeat, profile)) if repeat else []
    stem = args.out or os.path.join("results", "sim", "validate-" + os.path.splitext(os.path.basename(args.bench_json))[0])
    pricing = "calibration" if calibration else "in-run" if in_run else "profile"
    save(stem, {"bench_json": args.bench_json, "args": vars(args), "step_cost": pricing}, predicted,
         checks=[as_dict(c) for c in checks], repeat_checks=[as_dict(c) for c in repeat_checks])
    x_key = next((k for k in SWEEP_KEYS if k in measured[0]), "rps")
    both = [{**r, "policy": f"{r['policy']} {kind}"} for kind, rows in (("sim", predicted), ("bench", measured), ("bench, other run", repeat))
            for r in rows]
    plot_panels(both, x_key, stem, f"simulated (CPU cost model) vs measured: {args.bench_json}")
    print_checks(checks)
    print(f"{sum(c.within for c in checks)}/{len(checks)} within the bar (attainment +-{ATTAINMENT_TOLERANCE}, TPOT p50 +-{TPOT_TOLERANCE:.0%})")
    if repeat_checks:
        print(f"the other measured run {args.repeat} as the prediction (the machine's run-to-run floor):")
        print_checks(repeat_checks, "rep")
        print(f"{sum(c.within for c in repeat_checks)}/{len(repeat_checks)} within the bar")
    print(f"wrote {stem}.json and {stem}.png")


def as_dict(c: Check) -> dict:
    return {**asdict(c), "tpot_p50_error": c.tpot_p50_error, "within": c.within}


def print_checks(checks: list[Check], other: str = "sim") -> None:
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"{'policy':>12} {'level':>28} {'joint meas/' + other:>15} {'tpot-only meas/' + other:>19} {'TPOT p50 ms meas/' + other:>21} ok")
    for c in checks:
        level = " ".join(f"{k}={v:g}" for k, v in c.level.items())
        print(f"{c.policy:>12} {level:>28} {c.measured_joint:7.2f}/{c.predicted_joint:<7.2f} "
              f"{c.measured_tpot_only:9.2f}/{c.predicted_tpot_only:<9.2f} {fmt(c.measured_tpot_p50_ms):>10}/{fmt(c.predicted_tpot_p50_ms):<10} "
              f"{'yes' if c.within else 'no'}")


if __name__ == "__main__":
    main()
