"""A batch of simulated runs behind one progress bar: each run is a policy, a workload, a replica count
and a router on one deployment; each gives one result row (the benchmark's metrics, harness/metrics.py,
plus the simulator's own), labelled with what the sweep varies."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from .scenario import Scenario
from .simulator import DRAIN_S, SimConfig, simulate
from .workload import SimRequest


@dataclass(frozen=True)
class RunSpec:
    policy: str
    requests: Sequence[SimRequest]
    label: dict = field(default_factory=dict)  # the swept values, copied into the row (rps, urgent_share, ...)
    replicas: int = 1
    router: str = "round_robin"
    name: str = ""  # the row's `policy` (plots draw one line per name); default the policy


def run_all(specs: Sequence[RunSpec], scenario_for: Callable[[str], Scenario], seed: int = 0, desc: str = "sim",
            drain_s: float = DRAIN_S, leave: bool = True) -> list[dict]:
    """Runs `specs` in order; `scenario_for(policy)` gives each run's deployment."""
    rows = []
    bar = tqdm(total=sum(len(s.requests) for s in specs), desc=desc, unit="req", leave=leave)
    for s in specs:
        sc = scenario_for(s.policy)
        bar.set_postfix_str(f"{s.name or s.policy} {' '.join(f'{k}={v:g}' for k, v in s.label.items())} x{s.replicas}")
        cfg = SimConfig(sc.replica, sc.cost, sc.acceptance, s.replicas, s.router, seed, drain_s)
        wall = time.monotonic()
        res = simulate(cfg, s.requests, bar.update)
        rows.append({**s.label, "policy": s.name or s.policy, "scheduler_policy": s.policy, "replicas": s.replicas,
                     "router": s.router, **res.summary(), "wall_s": time.monotonic() - wall})
    bar.close()
    return rows
