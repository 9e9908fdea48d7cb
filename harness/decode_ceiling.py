"""The decode-aware ceiling: the most requests any schedule can serve with both deadlines met in the
decode-aware bound's model (harness/decode_bound.py: each request a prefill phase due at its first
token's deadline, then a decode phase due at its last token's, on one preemptive machine), solved
exactly as an integer program rather than by the bound's dropping heuristic.

Why the program is exact: for one preemptive machine with release times, a set of phases can all meet
their deadlines iff for every window [t1, t2] (t1 a release, t2 a deadline) the work of the phases
released at or after t1 and due by t2 fits in t2 - t1 (the processor-demand condition; EDF then meets
every deadline, and it runs each request's decode after its prefill, as harness/decode_bound.py
argues). So with x_j in {0, 1} for request j: maximise sum x_j subject to, for every window,
sum_j x_j * (work of j's phases inside it) <= t2 - t1. A request late even alone gets x_j = 0.

Why it stays an upper bound however the solver ends: the windows are many (releases x deadlines), so
they are added as they are violated: solve with the windows found so far, find the windows the
solution overfills, add them, solve again. A program with fewer windows only allows more, so each
solve's optimum, and the solver's dual bound when its time runs out, is at least the true one: the
ceiling is the floor of the lowest. Solves stop after ROUNDS, or TIME_LIMIT_S in all. When a solution
overfills no window it is the optimum itself (`exact`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.decode_bound import TwoPhaseJob, job_phases
from harness.prefill_bound import EPS_S

ROUNDS = 30  # solves at most; each adds the windows the last solution overfilled
TIME_LIMIT_S = 20.0  # for all solves together
SLACK_S = 1e-6  # a window overfilled by less is within the solver's tolerance, not overfilled


@dataclass(frozen=True)
class CeilingResult:
    total: int
    on_time: int  # the most requests served in time, or an upper bound on it when not `exact`
    exact: bool  # the optimum itself (the last solution overfilled no window)
    served: tuple[int, ...]  # the last solution's requests (the optimum's when exact), ascending

    @property
    def share(self) -> float:
        return self.on_time / self.total if self.total else 1.0


def decode_aware_ceiling(jobs: Sequence[TwoPhaseJob], prefill_tok_s: float, decode_tok_s: float = math.inf,
                         rounds: int = ROUNDS, time_limit_s: float = TIME_LIMIT_S) -> CeilingResult:
    """The most of `jobs` servable with both deadlines met (module docstring)."""
    from scipy.optimize import LinearConstraint, milp
    from scipy.sparse import csr_array

    phases = job_phases(jobs, prefill_tok_s, decode_tok_s)
    n = len(jobs)
    if not n:
        return CeilingResult(0, 0, True, ())
    release = np.array([p.release_s for p in phases])
    deadline = np.array([p.deadline_s for p in phases])
    work = np.array([p.work_s for p in phases])
    owner = np.array([p.owner for p in phases])
    alone = np.bincount(owner, weights=work, minlength=n)  # each request's work, both phases
    ends = release + np.where([p.decode for p in phases], alone[owner], work)  # a phase's end, its job alone
    upper = np.ones(n)
    upper[np.unique(owner[ends > deadline + EPS_S])] = 0.0  # late even alone
    order = np.argsort(deadline, kind="stable")  # phases by deadline, for the window scans
    windows: set[tuple[float, float]] = set()
    bound, served, exact = float(n), np.flatnonzero(upper), False
    give_up = time.monotonic() + time_limit_s
    for _ in range(rounds):
        constraints = []
        if windows:
            rows = [_coefficients(t1, t2, release, deadline, work, owner, n) for t1, t2 in sorted(windows)]
            constraints = [LinearConstraint(csr_array(np.array(rows)), -np.inf,
                                            [t2 - t1 + EPS_S for t1, t2 in sorted(windows)])]
        res = milp(-np.ones(n), integrality=np.ones(n), bounds=(np.zeros(n), upper), constraints=constraints,
                   options={"time_limit": max(0.1, give_up - time.monotonic())})
        if res.status == 0:  # the optimum with these windows: at least the true one
            bound = min(bound, -res.fun)
        elif res.status == 1 and getattr(res, "mip_dual_bound", None) is not None:  # out of time: its dual bound
            bound = min(bound, -res.mip_dual_bound)
        if res.x is None or res.status not in (0, 1):  # no solution to check: the bound so far stands
            break
        x = np.round(res.x)
        served = np.flatnonzero(x > 0.5)
        overfilled = _overfilled(x, release, deadline, work, owner, order)
        if not overfilled - windows:  # none, or only within the solver's tolerance
            exact = res.status == 0 and not overfilled
            break
        windows |= overfilled
        if time.monotonic() > give_up:
            break
    on_time = min(n, math.floor(bound + 1e-6))
    return CeilingResult(n, on_time, exact, tuple(int(i) for i in served))


def _coefficients(t1: float, t2: float, release, deadline, work, owner, n: int) -> np.ndarray:
    """Each request's work inside [t1, t2]: its phases released at or after t1 and due by t2."""
    inside = (release >= t1) & (deadline <= t2)
    return np.bincount(owner[inside], weights=work[inside], minlength=n)


def _overfilled(x, release, deadline, work, owner, order) -> set[tuple[float, float]]:
    """Per release time t1, the window [t1, t2] the served requests `x` overfill the most, if any."""
    load = work * x[owner]
    out = set()
    for t1 in np.unique(release[x[owner] > 0.5]):
        idx = order[release[order] >= t1]  # phases released from t1 on, by deadline
        if not len(idx):
            continue
        over = np.cumsum(load[idx]) - (deadline[idx] - t1)
        # within a run of equal deadlines only the last cumulative sum is the window's demand
        last = np.append(deadline[idx][1:] != deadline[idx][:-1], True)
        over = np.where(last & np.isfinite(deadline[idx]), over, -np.inf)
        k = int(np.argmax(over))
        if over[k] > SLACK_S:
            out.add((float(t1), float(deadline[idx][k])))
    return out
