"""Routers over N simulated replicas: which replica a new request joins.

Every router decides from what a real router sees: each replica's `ReplicaLoad`, measured by the same
`measure_load` a Ray Serve replica publishes (adaserve_backend/replica_routing.py), from the
simulated replica's own scheduler and estimator. So `slo` is the Ray Serve SLO router's decision
(`replica_routing.rank`), and a log of real routing decisions can be replayed through every router here
(sim/router_check.py). Loads are read fresh at each arrival: the simulator has no publishing period.

`round_robin` ignores loads; `least_loaded` counts requests held (running, waiting and queued);
`slo` keeps the replicas predicted to meet both targets and picks the earliest first token, else the
least occupied.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq

from adaserve_backend.replica_routing import Job, ReplicaLoad, occupancy, prefix_hints, rank
from adaserve_backend.sequence import Sequence

from .replica import Replica


def job_of(seq: Sequence, block_size: int = 0) -> Job:
    """As RayBackend makes it; with `block_size`, the prompt's prefix hints (the sequence keeps the block
    keys, which the scheduler's prefix match then reuses)."""
    slo = seq.slo
    hints = prefix_hints(seq.tokens, block_size, seq.block_keys.setdefault(block_size, [])) if block_size else ()
    return Job(seq.prefill_goal, None if slo.tpot_ms is None else slo.tpot_s, None
               if slo.ttft_ms is None else slo.ttft_s,
               "", hints, block_size)


class Router:
    name = "base"
    reads_loads = True

    def route(self, seq: Sequence, replicas: Seq[Replica], now: float) -> Replica:
        loads = [r.load_at(now) for r in replicas] if self.reads_loads else [None] * len(replicas)
        cfg = replicas[0].config
        block_size = cfg.block_size if cfg.prefix_caching and self.reads_loads else 0
        return replicas[self.choose(job_of(seq, block_size), loads)]

    def choose(self, job: Job, loads: Seq[ReplicaLoad | None], sent: Seq[list[int]] | None = None) -> int:
        """The index of the replica `job` goes to, from the replicas' loads and the prompt lengths sent to
        each since its load was measured."""
        raise NotImplementedError


class RoundRobin(Router):
    name = "round_robin"
    reads_loads = False

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, job, loads, sent=None):
        return next(self._next) % len(loads)


class LeastLoaded(Router):
    name = "least_loaded"

    def choose(self, job, loads, sent=None):
        sent = sent or [[] for _ in loads]
        held = [(ld.running + ld.waiting if ld else 0) + len(s) for ld, s in zip(loads, sent)]  # unpublished: none
        return min(range(len(loads)), key=lambda i: (held[i], i))


class SloAware(Router):
    name = "slo"

    def choose(self, job, loads, sent=None):
        tiers = rank(job, dict(enumerate(loads)), dict(enumerate(sent)) if sent else None)
        if not tiers:  # none healthy: the least occupied, as a Ray router falls back to trying one
            return min(range(len(loads)), key=lambda i: occupancy(loads[i]))
        return tiers[0][0]


ROUTERS = {"round_robin": RoundRobin, "rr": RoundRobin, "least_loaded": LeastLoaded, "ll": LeastLoaded, "slo": SloAware}


def make_router(name: str) -> Router:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; one of {', '.join(ROUTERS)}")
    return ROUTERS[name]()
