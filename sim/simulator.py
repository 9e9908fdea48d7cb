"""The discrete-event loop: requests arrive, a router places them, each replica runs iterations of its
real scheduler on the virtual clock (replica.py); finished requests are scored with the benchmark's
own metrics (harness/metrics.py), so simulated and measured results read the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adaserve_backend.request import RequestOutput
from harness.metrics import RequestRecord, summarize

from .acceptance import AcceptanceModel
from .clock import EventQueue, Kind
from .cost import IterationCost
from .replica import Replica, ReplicaConfig
from .router import Router, make_router
from .workload import SimRequest

POLL_S = 0.005  # an idle replica with work it could not plan (nothing admissible yet) looks again
DRAIN_S = 120.0  # after the last arrival, requests still unfinished by then count as violations


@dataclass(frozen=True)
class SimConfig:
    replica: ReplicaConfig
    cost: IterationCost
    acceptance: AcceptanceModel
    replicas: int = 1
    router: str = "round_robin"
    seed: int = 0
    drain_s: float = DRAIN_S


@dataclass
class SimResult:
    records: list[RequestRecord]
    end_s: float
    iterations: int
    mean_accepted: float
    preemptions: int
    overloads: dict[str, int]
    per_replica: list[int]

    def summary(self) -> dict:
        out = summarize(self.records, self.end_s)
        # the paper's goodput counts requests meeting the TPOT target alone
        tpot_tokens = sum(r.output_tokens for r in self.records if r.tpot_attained)
        out.update(tpot_goodput_tok_s=tpot_tokens / self.end_s if self.end_s > 0 else 0.0,
                   tpot_violations=sum(not r.tpot_attained for r in self.records),
                   simulated_s=self.end_s, iterations=self.iterations, mean_accepted_per_verify=self.mean_accepted,
                   preemptions=self.preemptions, overloads=self.overloads, requests_per_replica=self.per_replica)
        return out


def simulate(cfg: SimConfig, requests: Sequence[SimRequest],
             progress: Callable[[int], None] | None = None) -> SimResult:
    rng = random.Random(cfg.seed)  # one stream per replica, drawn from the run's seed
    replicas = [Replica(i, cfg.replica, cfg.cost, cfg.acceptance, random.Random(rng.getrandbits(64)))
                for i in range(cfg.replicas)]
    router: Router = make_router(cfg.router)
    q = EventQueue()
    records = {r.request_id: RequestRecord(r.request_id, r.category, r.tpot_slo_ms, r.arrival_s,
                                           ttft_slo_ms=r.ttft_slo_ms)
               for r in requests}
    routed = [0] * len(replicas)
    waking = [False] * len(replicas)
    for i, r in enumerate(sorted(requests, key=lambda r: r.arrival_s)):
        q.push(r.arrival_s, Kind.ARRIVAL, (i, r))
    horizon = max((r.arrival_s for r in requests), default=0.0) + cfg.drain_s

    def wake(rep: Replica, t: float) -> None:
        if not waking[rep.index] and not rep.busy:
            waking[rep.index] = True
            q.push(t, Kind.WAKE, rep)

    def take(outputs: list[RequestOutput]) -> None:  # as harness/runners.run_inprocess records them
        for out in outputs:
            if records[out.request_id].take(out) and progress:
                progress(1)

    while q and q.peek_time() <= horizon:
        ev = q.pop()
        if ev.kind == Kind.ARRIVAL:
            i, r = ev.payload
            seq = r.sequence(i)
            rep = router.route(seq, replicas, q.now)
            routed[rep.index] += 1
            rep.add(seq, r.stop_after, r.continuation)
            wake(rep, q.now)
        elif ev.kind == Kind.END:
            rep = ev.payload
            take(rep.finish())
            wake(rep, q.now)
        else:
            rep = ev.payload
            waking[rep.index] = False
            if rep.busy or not rep.has_work():
                continue
            take(rep.begin(q.now))
            if rep.in_flight is not None:
                q.push(rep.in_flight.end, Kind.END, rep)
            elif rep.has_work():
                waking[rep.index] = True
                q.push(q.now + POLL_S, Kind.WAKE, rep)
    unfinished = {s.request.request_id for rep in replicas for s in list(rep.scheduler.running)
                  + list(rep.scheduler.waiting) + rep.inbox}
    for rid in unfinished:
        records[rid].error = "not finished within the simulated time"
    est = [rep.estimator for rep in replicas]
    verifications = sum(e.total_verifications for e in est)
    return SimResult(
        list(records.values()), q.now, sum(rep.iterations for rep in replicas),
        sum(e.total_accepted for e in est) / max(verifications, 1),
        sum(rep.scheduler.num_preemptions for rep in replicas),
        _merge([rep.scheduler.overloads for rep in replicas]), routed,
    )


def _merge(dicts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out
