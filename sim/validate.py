"""The simulator against a measured `make bench` run: the same workload, policies and load levels on
the CPU cost model, predicted next to measured joint and TPOT-only attainment and TPOT p50.

    make bench && make sim-validate                        # the latest runs/*-bench/quick-rps.json
    python -m sim.validate runs/<date>-bench/quick-rps.json [--seed 0 --output-scale 0.5 --time-limit 90]
    python -m sim.validate B.json --fit-from A.json --repeat A.json   # A: an earlier run
    python -m sim.validate B.json --fit-from A.json --speed steps --speed-band 0.05

The workload is rebuilt by harness.bench's own level_items (Poisson arrivals of int(rps * duration)
requests, a fresh prompt deck per level as an in-process bench run deals it, the urgent-share and
SLO-scale sweeps' mixes and targets), and each prompt is encoded with the served tokenizer as
harness.bench.InProcess does, so prompt lengths are the measured run's; a prompt ends where the measured
runs saw the model stop it (their `outputs`), else at max_tokens. The bench JSON does not record
its --seed, --output-scale and --time-limit: pass them if the run changed them (defaults are bench's).
Each request carries its prompt's greedy output from the served target (sim/continuations.py), so the
engine's copies (prompt lookup, the suffix index) hit where they would; `--no-copies` leaves them out.
Target steps are priced by a fit to other runs' recorded iterations: `--fit-from` benches (a calibration
run on the same machine; none of the validated bench's own measurements then price it), else every run of
this bench but the one predicted (`--step-cost in-run`, the default when every run recorded its
iterations), or by the profile's synthetic sweep (`--step-cost profile`); the draft's forwards by the
profile's roofline. Times are scaled by the speed the machine had during each measured run: `--speed
probe` (default) its `speed_probe_ms`, the profile's own forwards timed either side of the run
(adaserve_backend.profiler.probe_ms in harness.bench); `steps` its own steps over the fit that prices them
(sim.calibration); `none` the profile's. `--speed-band D` simulates each run at its speed x (1 -+ D)
too. Acceptance from `--acceptance` (default: the engine's recorded table), scaled with `--fit-from` to
the calibration runs' tokens per verification. The simulated scheduler plans with the profile file's
rooflines, or with those the served engine planned with where the run recorded them (`--rooflines
recorded`). The issue's bar: attainment within 0.05 and TPOT p50
within 10% at every level. `--repeat` judges another measured run of the same bench by the same bar, as if it were
the prediction: what the bar means on a machine whose runs differ from each other. A bench whose levels
were repeated (`harness.bench --repeats N`, what `make sim-validate` measures) is also judged by each
level's band of repeats (sim/bands.py). Writes <out>.json and <out>.png.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.step_cost import EngineStepCost
from harness.run_dir import run_dir
from harness.slo_targets import SloTargets
from harness.workload import prompt_deck

from .acceptance import acceptance_model
from .bands import bands, print_bands
from .calibration import (
    SPEED_MOVED,
    calibrated_acceptance,
    held_out_step,
    probe_speed,
    speculating_runs,
    speed_moved,
    step_fit,
    steps_speed,
    with_step,
)
from .checks import ATTAINMENT_TOLERANCE, TPOT_TOLERANCE, Check, as_dict, print_checks
from .continuations import with_continuations
from .plots import plot_panels
from .report import save
from .runs import RunSpec, run_all
from .scenario import scenario
from .validate_args import parse
from .workload import SimRequest

SWEEP_KEYS = ("urgent_share", "urgent_slo_scale")  # a bench row's level besides rps
def level_of(row: dict) -> dict:
    return {"rps": row["rps"], **{k: row[k] for k in SWEEP_KEYS if k in row}}


def level_key(level: dict) -> str:
    """A level as a dict key (the workloads are built once per level)."""
    return json.dumps(level, sort_keys=True)


def sim_requests(items, encode, stops: dict | None = None) -> list[SimRequest]:
    """`stops`: (prompt, chat) -> the output token at which the served model ended it (stop_lengths)."""
    stops = stops or {}
    out = []
    for it in items:
        ids, stop = tuple(encode(it)), stops.get((it.prompt, it.chat))
        out.append(SimRequest(it.request_id, it.category, len(ids), it.max_tokens, it.tpot_slo_ms,
                              it.ttft_slo_ms, it.arrival_s,
                              stop if stop is not None and stop <= it.max_tokens else None, ids))
    return out


def stop_lengths(measured: list[dict], items_of) -> dict:
    """Where the served model ended each prompt with its end of sequence, from every measured run's
    `outputs` (harness.bench: request id -> [output tokens, finish reason]): (prompt, chat) -> the median
    stop length. Which token ends a prompt is the workload's (greedy decoding of that prompt), not the
    serving policy's, so every run's stops apply to all; a prompt never seen to stop runs to max_tokens."""
    seen: dict[tuple, list[int]] = {}
    for row in measured:
        by_id = {it.request_id: it for it in items_of(level_of(row))}
        for rid, (n, reason) in row.get("outputs", {}).items():
            if reason == "stop" and rid in by_id:
                seen.setdefault((by_id[rid].prompt, by_id[rid].chat), []).append(n)
    return {k: sorted(v)[len(v) // 2] for k, v in seen.items()}


def sibling_speed(measured: list[dict], speeds: list[float], i: int) -> float | None:
    """The median speed of run i's twins (same policy and level, other repeats); None without one."""
    twins = [s for j, (r, s) in enumerate(zip(measured, speeds)) if j != i and r["policy"] == measured[i]["policy"]
             and level_of(r) == level_of(measured[i])]
    return statistics.median(twins) if twins else None


def same_run(rows: list[dict], m: dict) -> dict:
    """The row of `rows` with measured run `m`'s policy, level and repeat."""
    return next(r for r in rows if r["policy"] == m["policy"] and level_of(r) == level_of(m)
                and r.get("repeat") == m.get("repeat"))


def compare(measured: list[dict], predicted: list[dict]) -> list[Check]:
    out = []
    for m in measured:
        p = same_run(predicted, m)
        out.append(Check(m["policy"], level_of(m), m["slo_attainment"], p["slo_attainment"], m["tpot_slo_attainment"],
                         p["tpot_slo_attainment"], m.get("tpot_ms_p50"), p.get("tpot_ms_p50")))
    return out


def speed_matched(measured: list[dict], speeds: list[float], other: list[dict], other_speed) -> list[dict]:
    """Another measured run's rows with their TPOT p50 scaled from its machine speed (`other_speed(row,
    i)`, read as the validated runs' are) to each measured run's, as the simulation is priced for each
    run's speed."""
    out = []
    for i, (m, speed) in enumerate(zip(measured, speeds)):
        o = same_run(other, m)
        tpot = o.get("tpot_ms_p50")
        out.append({**o, "tpot_ms_p50": tpot and tpot * speed / other_speed(o, i)})
    return out


def main(argv=None) -> None:
    args = parse(argv, __doc__)
    with open(args.bench_json) as f:
        bench = json.load(f)
    if bench.get("target", "inprocess") != "inprocess" or bench.get("sweep") == "fluctuating":
        raise SystemExit("validate compares in-process rps / urgent_share / slo_scale sweeps only")
    from adaserve_backend.config import EngineConfig
    from harness.bench import InProcess, level_items

    config_path = bench.get("config", "model_repository/adaserve/1/engine.json")
    config = EngineConfig.from_json(config_path)
    encode = InProcess(config).encode  # the tokenizer only, no model
    slos = SloTargets(**bench["slo_targets"])
    keep = set(filter(None, args.policies.split(",")))
    measured = [r for r in bench["rows"] if not keep or r["policy"] in keep]
    levels = list({level_key(level_of(r)): level_of(r) for r in measured}.values())
    items = {level_key(lv): level_items(lv, bench["duration_s"], slos, prompt_deck(seed=args.seed), args.seed,
                                        args.output_scale) for lv in levels}
    # Where each prompt stops is read off the other runs, never the judged one (its own stops would tell
    # the simulator the lengths it is judged on); calibration runs use every measured run's.
    def run_key(row: dict) -> str:
        return level_key({**level_of(row), "policy": row["policy"], "repeat": row.get("repeat")})

    def stops_without(row: dict | None) -> dict:
        return stop_lengths([r for r in measured if r is not row], lambda lv: items[level_key(lv)])
    encoded = functools.cache(encode)  # every run of a level encodes the same items
    every_stop = stops_without(None)
    workloads = {run_key(r): sim_requests(items[level_key(level_of(r))], encoded, stops_without(r)) for r in measured}
    workloads |= {key: sim_requests(its, encoded, every_stop) for key, its in items.items()}
    print(f"each run's prompts end where the other runs stopped them ({len(every_stop)} prompts seen to "
          "stop); the others run to max_tokens")
    if args.copies:
        workloads = with_continuations(config, workloads)

    def spec_of(row: dict) -> RunSpec:  # the simulated run of a bench row: its policy on its level's workload
        repeat = {"repeat": row["repeat"]} if "repeat" in row else {}
        judged = workloads.get(run_key(row)) if row in measured else None
        return RunSpec(row["policy"], judged or workloads[level_key(level_of(row))], {**level_of(row), **repeat})
    specs = [spec_of(r) for r in measured]
    for r, s in zip(measured, specs):
        if r.get("requests") not in (None, len(s.requests)):
            raise SystemExit(f"{r['policy']} {level_of(r)}: the bench sent {r['requests']} requests, "
                             f"the rebuilt workload has "
                             f"{len(s.requests)}: pass the run's --seed / duration")
    profile = CostModel.load(config.speculation.profile_path)
    fallback = EngineStepCost.from_profile(config.speculation.profile_path)
    probe = (lambda r: 1.0) if args.speed == "none" else (lambda r: probe_speed(profile, r))
    in_run = args.step_cost == "in-run" or (args.step_cost == "auto" and len(levels) > 1
                                            and all(r.get("iterations") for r in measured))
    cal_rows = [r for path in args.fit_from for r in json.load(open(path))["rows"]]
    calibration = step_fit(cal_rows, [probe(r) for r in cal_rows], profile, fallback) if cal_rows else None
    print("target steps priced by", "a fit to " + ", ".join(args.fit_from) if calibration else
          "a fit to the other runs' iterations" if in_run else "the profile's step fit")
    probes = [probe(r) for r in measured]
    steps = [calibration or (held_out_step(measured, probes, i, profile, fallback, level_of) if in_run else None)
             for i in range(len(measured))]

    def speed_of(row: dict, step) -> float:
        if args.speed not in ("steps", "siblings"):
            return probe(row)
        if step is None:
            raise SystemExit(f"--speed {args.speed} reads a run's speed off a step fit: pass --fit-from or runs with "
                             "iterations")
        return steps_speed(row, step)
    speeds = [speed_of(r, step) for r, step in zip(measured, steps)]
    if args.speed == "siblings":  # each run at the median speed of its level's other repeats, never its own
        speeds = [sibling_speed(measured, speeds, i) or probes[i] for i in range(len(measured))]
    print(f"machine speed per run ({args.speed}; x profile; ! where its probes before and after differ by more than "
          f"{SPEED_MOVED - 1:.0%}):",
          " ".join(f"{r['policy']}@{r['rps']:g}={v:.2f}{'!' * speed_moved(r)}" for r, v in zip(measured, speeds)))
    drain_s = max(0.0, args.time_limit - bench["duration_s"])

    def planned(row: dict) -> CostModel | None:
        recorded = args.rooflines == "recorded" and row.get("cost_model")
        return CostModel.from_dict(row["cost_model"]) if recorded else None
    if args.rooflines == "recorded":
        served = sum(bool(r.get("cost_model")) for r in measured)
        print(f"scheduler rooflines: as the served engine planned with in {served} "
              f"of {len(measured)} runs, the profile file's in the others")

    def simulate_runs(runs: list[tuple[RunSpec, float, object, CostModel | None]], acceptance, desc: str) -> list[dict]:
        rows = []
        for spec, speed, step, rooflines in runs:  # one run each: each is priced for its own speed
            def deploy(policy, speed=speed, step=step, rooflines=rooflines):
                sc = scenario("cpu", policy=policy, engine_json=config_path, cpu_speed=speed)
                cost = dataclasses.replace(with_step(sc.cost, step),
                                           calibrate=args.rooflines == "calibrated", planned=rooflines)
                return dataclasses.replace(sc, cost=cost, acceptance=acceptance,
                                           replica=dataclasses.replace(sc.replica, copies=args.copies))
            (row,) = run_all([spec], deploy, args.seed, desc, drain_s=drain_s, leave=False)
            rows.append({**row, "machine_speed": speed})
        return rows

    acceptance, factor = acceptance_model(args.acceptance), None
    speculated = [r for r in speculating_runs(cal_rows) if level_key(level_of(r)) in workloads]
    if calibration and args.calibrate_acceptance and speculated:
        cal_runs = [(spec_of(r), speed_of(r, calibration), calibration, planned(r)) for r in speculated]
        acceptance, factor = calibrated_acceptance(
            acceptance, speculated,
            lambda model: [r["mean_accepted_per_verify"] for r in simulate_runs(cal_runs, model, "acceptance")])
        print(f"acceptance: {args.acceptance} x{factor:.2f}, the calibration runs' "
              f"{sum(r['mean_accepted_per_verify'] for r in speculated) / len(speculated):.2f} tokens per verification")
    rooflines = [planned(r) for r in measured]
    predicted = simulate_runs(list(zip(specs, speeds, steps, rooflines)), acceptance, "cpu vs bench")
    band = {f: simulate_runs([(sp, v * f, st, rl) for sp, v, st, rl in zip(specs, speeds, steps, rooflines)],
                             acceptance, f"speed x{f:g}")
            for f in ((1 - args.speed_band, 1 + args.speed_band) if args.speed_band else ())}
    checks = compare(measured, predicted)
    found = bands(measured, predicted, level_of)
    repeat = [r for r in json.load(open(args.repeat))["rows"] if not keep or r["policy"] in keep] if args.repeat else []
    repeat_checks = compare(measured, speed_matched(measured, speeds, repeat,
                                                    lambda o, i: speed_of(o, steps[i]))) if repeat else []
    stem = args.out or os.path.join(run_dir("sim-validate"), "validate-"
                                    + os.path.splitext(os.path.basename(args.bench_json))[0])
    pricing = "calibration" if calibration else "in-run" if in_run else "profile"
    save(stem, {"bench_json": args.bench_json, "args": vars(args), "step_cost": pricing, "speed": args.speed,
                 "acceptance_factor": factor}, predicted,
         checks=[as_dict(c) for c in checks], repeat_checks=[as_dict(c) for c in repeat_checks],
         speed_band={f"{f:g}": rows for f, rows in band.items()}, bands=[b.as_dict() for b in found])
    x_key = next((k for k in SWEEP_KEYS if k in measured[0]), "rps")
    both = [{**r, "policy": f"{r['policy']} {kind}"}
            for kind, rows in (("sim", predicted), ("bench", measured), ("bench, other run", repeat))
            for r in rows]
    plot_panels(both, x_key, stem, f"simulated (CPU cost model) vs measured: {args.bench_json}")
    print_checks(checks)
    print(f"{sum(c.within for c in checks)}/{len(checks)} within the bar (attainment +-{ATTAINMENT_TOLERANCE}, TPOT "
          f"p50 +-{TPOT_TOLERANCE:.0%})")
    if band:  # checks at x(1 - D), the run's speed, x(1 + D)
        rows = [(lo, c, hi) for c, lo, hi in zip(checks, *(compare(measured, r) for r in band.values()))]
        print(f"{sum(any(c.within for c in r) for r in rows)}/{len(rows)} within the bar at the run's speed or x(1 -+ "
              f"{args.speed_band:g}); "
              "joint attainment measured, then predicted at those three speeds:")
        for r in rows:
            print(f"  {r[1].policy:>10} {' '.join(f'{k}={v:g}' for k, v in r[1].level.items())}: "
                  f"{r[1].measured_joint:.2f}, "
                  + " / ".join(f"{c.predicted_joint:.2f}" for c in r))
    if found:
        print("the band protocol: each level's repeats measured, and the simulator priced at each one's speed "
              "(sim/bands.py)")
        print_bands(found)
    if repeat_checks:
        print(f"the other measured run {args.repeat} as the prediction (the machine's run-to-run floor):")
        print_checks(repeat_checks, "rep")
        print(f"{sum(c.within for c in repeat_checks)}/{len(repeat_checks)} within the bar")
    print(f"wrote {stem}.json and {stem}.png")


if __name__ == "__main__":
    main()
