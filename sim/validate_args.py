"""sim.validate's command line: which measured bench run, and how the simulator prices it (the module
docstring of sim/validate.py says what each choice means)."""

from __future__ import annotations

import argparse


def parse(argv=None, description: str = "") -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sim.validate", description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json",
                    help="a harness.bench result (runs/<date>-bench/<suite>-<sweep>.json), in-process target")
    ap.add_argument("--seed", type=int, default=0, help="the bench run's --seed")
    ap.add_argument("--output-scale", type=float, default=0.5, help="the bench run's --output-scale")
    ap.add_argument("--time-limit", type=float, default=90.0, help="the bench run's --time-limit (s)")
    ap.add_argument("--acceptance", default="engine", help="acceptance model (sim/acceptance.py)")
    ap.add_argument("--speed", choices=["probe", "siblings", "steps", "none"], default="probe",
                    help="each run's machine speed: its speed probes (independent of the run); its level's other "
                         "repeats' steps over the fit that prices them (sim.calibration.steps_speed), never its own; "
                         "its own steps (reads the judged run: a diagnostic, not a validation); or the profile's")
    ap.add_argument("--calibrate-acceptance", action=argparse.BooleanOptionalAction, default=True,
                    help="with --fit-from: scale the acceptance table to the calibration runs' tokens per verification")
    ap.add_argument("--speed-band", type=float, default=0.0, metavar="D",
                    help="also simulate every run at its speed x (1 -+ D): how much of a miss an error of D in the "
                         "machine's speed explains (near a load's capacity attainment turns on a few percent)")
    ap.add_argument("--step-cost", choices=["auto", "in-run", "profile"], default="auto",
                    help="price target steps with a fit to the bench's other runs' iterations or the profile's sweep; "
                         "auto: in-run if every run recorded its iterations")
    ap.add_argument("--fit-from", nargs="+", default=[], metavar="BENCH_JSON",
                    help="price target steps by a fit to these other bench runs' iterations (a calibration run on this "
                         "machine) instead of the validated bench's: none of its own measurements then price it")
    ap.add_argument("--repeat", default="", metavar="BENCH_JSON",
                    help="another run of the same bench, judged by the same bar as a prediction of this one: how close "
                         "the measured system comes to itself from run to run (the bar's noise floor on this machine)")
    ap.add_argument("--copies", action=argparse.BooleanOptionalAction, default=True,
                    help="simulate the engine's copies (prompt lookup, the suffix index) on each prompt's greedy "
                         "output, generated once with the served target (sim/continuations.py)")
    ap.add_argument("--rooflines", choices=["profile", "recorded", "calibrated"], default="recorded",
                    help="the simulated scheduler's rooflines: the profile file's; those the served engine planned "
                         "with where the run recorded them (its startup calibration; else the file's); or measured on "
                         "the simulated machine at start as that calibration does (sim.cost.calibrated_profile). "
                         "Recorded ones reproduce the served iterations, yet predict attainment no better so far: as "
                         "far over as the file's are under (docs/experiments.md#sim-twin-gap)")
    ap.add_argument("--policies", default="", help="only these policies (comma-separated; default: the run's)")
    ap.add_argument("--out", default="", help="output stem (default runs/<date>-sim-validate/validate-<bench name>)")
    return ap.parse_args(argv)
