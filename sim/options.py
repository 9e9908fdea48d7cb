"""Command-line options the simulator's commands share (sweep, paper figures, scale-out), with their
defaults in one place, and the deployment they name."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .scenario import Scenario, scenario
from .workload import SLO_MODES

DEFAULTS = dict(
    hardware="a100x4",  # the paper's testbed for Llama-3.1-70B
    model="llama70b",
    acceptance=None,  # the model's preset (acceptance.DEFAULT_FOR_MODEL)
    max_slowdown=1.3,  # B from the roofline as tools.profile picks it
    slo_mode="absolute",  # the paper's targets as stated
    arrival="poisson",
    duration_s=600.0,  # ten simulated minutes of arrivals per run
    output_scale=1.0,
    seed=0,
)


@dataclass(frozen=True)
class Deploy:
    hardware: str
    model: str
    acceptance: str | None
    max_slowdown: float
    slo_mode: str
    scheduler: tuple[tuple[str, object], ...] = ()  # SchedulerConfig fields set on every replica

    def scenario(self, policy: str) -> Scenario:
        return scenario(self.hardware, self.model, policy, self.acceptance, self.max_slowdown, self.slo_mode,
                        **dict(self.scheduler))


def scheduler_settings(text: str) -> tuple[tuple[str, object], ...]:
    """`overload=best_effort,slo_admission=false,max_num_seqs=64` -> typed pairs."""
    out = []
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        low = value.strip().lower()
        typed: object = {"true": True, "false": False}.get(low, value.strip())
        if isinstance(typed, str):
            try:
                typed = float(typed) if "." in typed else int(typed)
            except ValueError:
                pass
        out.append((key.strip(), typed))
    return tuple(out)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def add_common(ap: argparse.ArgumentParser, **overrides) -> None:
    """The deployment and workload options; `overrides` change a command's defaults."""
    d = {**DEFAULTS, **overrides}
    ap.add_argument("--hardware", default=d["hardware"],
                    help="cpu, a100xN, h100xN (measured peaks) or h100sheetxN (the datasheet's) "
                         "(N: tensor-parallel GPUs per replica)")
    ap.add_argument("--model", default=d["model"], choices=["llama70b", "qwen32b"],
                    help="target and its draft (GPU only)")
    ap.add_argument("--acceptance", default=d["acceptance"],
                    help="llama70b-1b, qwen32b-05b, engine or a JSON table (default: the model's)")
    ap.add_argument("--max-slowdown", type=float, default=d["max_slowdown"],
                    help="GPU budget B: the largest verification within this x the flat latency (as tools.profile)")
    ap.add_argument("--slo-mode", default=d["slo_mode"], choices=SLO_MODES,
                    help="absolute: the paper's 50/150 ms chat/summary targets; relative: 2x/6x the baseline TPOT")
    ap.add_argument("--arrival", default=d["arrival"],
                    help="poisson, gamma (bursty, CV 3), azure (gamma with the Azure trace's CV), azure:TRACE.csv, "
                         "fluctuating")
    ap.add_argument("--duration-s", type=float, default=d["duration_s"], help="simulated seconds of arrivals")
    ap.add_argument("--output-scale", type=float, default=d["output_scale"],
                    help="scales the benchmark's output length ranges")
    ap.add_argument("--seed", type=int, default=d["seed"])
    ap.add_argument("--scheduler", type=scheduler_settings, default=(),
                    help="SchedulerConfig fields for every policy, e.g. overload=best_effort,slo_admission=false")


def deploy(args: argparse.Namespace) -> Deploy:
    return Deploy(args.hardware, args.model, args.acceptance, args.max_slowdown, args.slo_mode, args.scheduler)
