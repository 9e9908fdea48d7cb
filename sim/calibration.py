"""What sim.validate prices a measured bench run with, each taken from measurements on the machine that
ran it: the target's step cost (a fit to recorded iterations), the machine's speed during the run, and the
draft's acceptance (the engine table scaled to what calibration runs produced per verification).

Why the speed has two sources: the speed probes either side of a run (harness.bench) are cheap and
independent of the run, but on a shared machine a run's own steps, priced by a fit from other runs,
now and then put its speed far from the probe's (a probe caught a slow second, or the machine moved
during the run; evidence: docs/experiments.md#sim-bands). `steps_speed` reads the speed off the run's own steps instead:
only their level over a fit from elsewhere, so batch shapes, queueing, speculation and attainment are still
the simulator's to predict; validate reports which source priced a result.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.step_cost import EngineStepCost

from .acceptance import AcceptanceModel

SPEED_MOVED = 1.2  # a run whose speed probes before and after differ by more: one speed cannot price it
SPECULATING = 1.2  # a run producing more tokens per verification than this calibrates acceptance


def probe_speed(profile: CostModel, row: dict) -> float:
    """A bench run's machine speed over the profile's, from its speed probe (1 without one)."""
    return profile.relative_speed(row.get("speed_probe_ms") or {})


def speed_moved(row: dict) -> bool:
    before, after = (row.get("speed_probes_ms") or [{}, {}])
    return any(max(before[k], after[k]) > SPEED_MOVED * min(before[k], after[k]) for k in before if k in after)


def step_fit(runs: list[dict], speeds: list[float], profile: CostModel,
             fallback: EngineStepCost | None) -> EngineStepCost:
    """The step cost fitted to `runs`' recorded iterations (each run's times divided by its machine
    speed), the draft's forwards included where they speculated (EngineStepCost.from_iterations)."""
    records = [{**r, "spec_ms": r["spec_ms"] / s, "step_ms": r["step_ms"] / s} for row, s in zip(runs, speeds)
               for r in row.get("iterations", [])]
    if not records:
        raise SystemExit("in-run step pricing needs bench runs that recorded their iterations (a harness.bench row's "
                         "`iterations`) in more than one run; pass --step-cost profile for older results")
    return EngineStepCost.from_iterations(records, fallback)


def held_out_step(measured: list[dict], speeds: list[float], i: int, profile: CostModel,
                  fallback: EngineStepCost | None, level_of) -> EngineStepCost:
    """The step cost fitted to the iterations of every measured run at other levels than run i's, so
    no run is priced by what it, or a twin repeat of its level, measured."""
    others = [j for j in range(len(measured)) if level_of(measured[j]) != level_of(measured[i])]
    return step_fit([measured[j] for j in others], [speeds[j] for j in others], profile, fallback)


def steps_speed(row: dict, step: EngineStepCost) -> float:
    """The run's speed over `step`'s (a fit from other runs): the target's part of its timed steps (each
    step less its speculation) summed, over the fit's price of the same steps summed. A sum, not a
    typical step: a step's time over its price spreads to the slow side (a tenth of them 10-20% over
    the median), and queues and attainment follow the total busy time, which a median priced 2-4% short
    (evidence: docs/experiments.md#sim-total-speed). The draft's forwards are assumed to move with the
    target's.

    Each step is measured as the fit prices it: a drafting step less its speculation (priced apart, by
    the draft's terms), a step that drafts nothing whole. The second's `spec_ms` is no draft: it is the
    step's CPU work before the forward (scheduling, copies, selection), which `from_iterations` fits
    into the target's terms, and which the simulator charges nowhere else; left out of the measured
    side, a run whose steps spend more of their time there is priced that much fast (evidence:
    docs/experiments.md#sim-undrafted-overhead)."""
    timed = [r for r in row.get("iterations", []) if r["step_ms"] > 0]
    if not timed:
        raise SystemExit(f"--speed steps: the {row['policy']} run at {row['rps']:g} rps recorded no iterations")
    measured = sum(r["step_ms"] - (r["spec_ms"] if r["depth"] else 0.0) for r in timed)
    return measured / sum(step.ms(r["n"], r["context"], r["verified"] + r["prefill"], r["n"] if r["depth"]
                                  else 0, r.get("prefills", 0))
                          for r in timed)


def calibrated_acceptance(model: AcceptanceModel, runs: Sequence[dict],
                          predict: Callable[[AcceptanceModel], list[float]],
                          low: float = 0.25, high: float = 2.0, rounds: int = 7) -> tuple[AcceptanceModel, float]:
    """`model` with every rate scaled by the one factor at which the simulator's tokens per verification
    over `runs` (calibration bench rows that speculated, SPECULATING) match what they measured;
    `predict(model)` simulates those runs. The table is a one-request evaluation of the draft's chains;
    served trees at load produce fewer tokens per verification than it predicts (evidence:
    docs/experiments.md#sim-bands). Bisection: more acceptance, more tokens."""
    target = statistics.mean(r["mean_accepted_per_verify"] for r in runs)
    for _ in range(rounds):
        mid = (low + high) / 2
        if statistics.mean(predict(model.scaled(mid))) < target:
            low = mid
        else:
            high = mid
    factor = (low + high) / 2
    return model.scaled(factor), factor


def speculating_runs(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("mean_accepted_per_verify", 0) > SPECULATING]


def with_step(cost, step: EngineStepCost | None):
    """A CpuIterationCost priced by `step` (None: as it is)."""
    return cost if step is None else dataclasses.replace(cost, step=step)
