"""Routers over N simulated replicas: which replica a new request joins.

`round_robin` and `least_loaded` look at counts only. `slo` asks each replica's own scheduler state and
estimator (the predictions its admission control uses) whether the request would meet its targets
there: its predicted TPOT with one more request decoding, and its predicted first token behind the
prefill work already queued. It picks the least loaded replica that meets both; else the one meeting
the first-token target with the lowest predicted TPOT (an estimator that has not measured speculation
yet predicts one token per iteration, so early on no TPOT target below one forward looks feasible);
else the one with the earliest predicted first token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from adaserve_backend.scheduler.deadlines import prefill_left
from adaserve_backend.sequence import Sequence

from .replica import Replica


class Router:
    name = "base"

    def route(self, seq: Sequence, replicas: Seq[Replica], now: float) -> Replica:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = itertools.count()

    def route(self, seq, replicas, now):
        return replicas[next(self._next) % len(replicas)]


class LeastLoaded(Router):
    name = "least_loaded"

    def route(self, seq, replicas, now):
        return min(replicas, key=lambda r: (r.load(), r.index))


@dataclass(frozen=True)
class Prediction:
    tpot_s: float
    first_token_s: float  # from now

    def meets(self, seq: Sequence) -> bool:
        return self.tpot_s <= seq.slo.tpot_s and self.first_token_s <= seq.slo.ttft_s


def predict(replica: Replica, seq: Sequence) -> Prediction:
    """What `replica` would give `seq`, by its estimator: every request it holds decoding alongside,
    and the prefill it has queued (inbox and waiting included) served before `seq`'s."""
    sched, est = replica.scheduler, replica.estimator
    held = list(sched.running) + list(sched.waiting) + replica.inbox
    n = sum(s.decoding for s in sched.running)
    ahead = sum(prefill_left(s) for s in held if not s.decoding)
    chunk = replica.policy.prefill_cap(sched.config, n)
    wait = replica.in_flight.end - replica.in_flight.plan.start if replica.in_flight else 0.0
    first = wait + est.first_token_s(n, ahead + seq.prefill_goal, max(chunk, 1))
    return Prediction(est.tpot_at(len(held) + 1), first)


class SloAware(Router):
    name = "slo"

    def route(self, seq, replicas, now):
        preds = [(predict(r, seq), r) for r in replicas]
        ok = [r for p, r in preds if p.meets(seq)]
        if ok:
            return min(ok, key=lambda r: (r.load(), r.index))
        in_time = [(p, r) for p, r in preds if p.first_token_s <= seq.slo.ttft_s]
        if in_time:
            return min(in_time, key=lambda pr: (pr[0].tpot_s, pr[1].load(), pr[1].index))[1]
        return min(preds, key=lambda pr: (pr[0].first_token_s, pr[1].index))[1]


ROUTERS = {"round_robin": RoundRobin, "rr": RoundRobin, "least_loaded": LeastLoaded, "ll": LeastLoaded, "slo": SloAware}


def make_router(name: str) -> Router:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; one of {', '.join(ROUTERS)}")
    return ROUTERS[name]()
