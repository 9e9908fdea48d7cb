"""The SLO-aware request router on Ray Serve's RequestRouter API: each request goes to a replica
predicted to meet both its targets, the one whose first token would come soonest (replica_routing.rank), from
the loads the replicas publish (`record_routing_stats`), each charged with the requests this router
sent it since. A replica predicted to miss is still tried, least occupied first: admission on the
replica then serves or refuses the request, so a 503 comes only when no replica would take it. Ray's
own routers, for the comparison: power of two choices (its default) and prefix-cache affinity.
With `record` (a path), each decision is appended there as a JSON line, what it was made from
included, for sim/router_check.py to replay through the simulator's routers."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from ..replica_routing import Job, ReplicaLoad, rank

SENT_MEMORY_S = 30.0  # sends older than this are in any replica's published load by now
ROUTERS = {"slo": "adaserve_backend.ray_serve.router.SLORouter",
           "pow2": "ray.serve._private.request_router.pow_2_router.PowerOfTwoChoicesRequestRouter",
           "prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router."
                     "PrefixCacheAffinityRouter"}


def recorded(load: ReplicaLoad, job: Job) -> dict:
    """A load as the decision log keeps it: of its cached blocks only those `job` would reuse."""
    return {**load.as_dict(),
            "cached_blocks": list(job.prefix_blocks[: load.holds(job) // job.block_size] if job.block_size else ())}


def job_of(pending: PendingRequest | None) -> Job:
    """The replica_routing.Job the backend sends beside the request (backend.RayBackend.stream)."""
    args = pending.args if pending is not None else []
    return args[1] if len(args) > 1 and isinstance(args[1], Job) else Job(0)


class SLORouter(FIFOMixin, RequestRouter):
    """Requests are routed concurrently (each routing task chooses, then probes its choice), so a burst
    would all see the same loads and land on one replica: a request is charged to its first choice as
    soon as it is ranked, and moved to the replica it went to once routed."""

    def initialize_state(self, record: str | None = None, **kwargs) -> None:
        self.sent: dict[ReplicaID, dict[str, tuple[float, int]]] = defaultdict(dict)  # request id -> (time, tokens)
        self.choice: dict[str, ReplicaID] = {}  # where each request being routed is charged for now
        self.record = record
        self.decided: dict[str, dict] = {}  # request id -> its last ranking, written once it is routed

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        now = time.time()
        by_id = {r.replica_id: r for r in candidate_replicas}
        loads, sent = {}, {}
        for rid, replica in by_id.items():
            load = loads[rid] = ReplicaLoad.from_dict(replica.routing_stats)
            self.sent[rid] = {k: (t, n) for k, (t, n) in self.sent[rid].items() if now - t < SENT_MEMORY_S}
            sent[rid] = [n for t, n in self.sent[rid].values() if load is None or t > load.at]
        self.choice = {k: rid for k, rid in self.choice.items() if k in self.sent[rid]}  # never routed: forgotten
        job = job_of(pending_request)
        tiers = rank(job, loads, sent)
        if pending_request is not None and tiers:
            self._charge(pending_request.metadata.request_id, tiers[0][0], now, job.prompt_tokens)
        if self.record and pending_request is not None:
            self.decided[pending_request.metadata.request_id] = {
                "at": now, "job": {**asdict(job), "prompt": ""}, "ranked": [[r.unique_id for r in t] for t in tiers],
                "loads": {r.unique_id: None if v is None else recorded(v, job) for r, v in loads.items()},
                "sent": {r.unique_id: v for r, v in sent.items()}}
        return [[by_id[rid] for rid in tier] for tier in tiers]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        self._charge(pending_request.metadata.request_id, replica_id, time.time(),
                     job_of(pending_request).prompt_tokens)
        self.choice.pop(pending_request.metadata.request_id, None)
        if (decision := self.decided.pop(pending_request.metadata.request_id, None)) is not None:
            with open(self.record, "a") as f:
                f.write(json.dumps({**decision, "routed": replica_id.unique_id}) + "\n")

    def _charge(self, request_id: str, replica_id: ReplicaID, at: float, tokens: int) -> None:
        if (before := self.choice.get(request_id)) is not None:
            self.sent[before].pop(request_id, None)
        self.choice[request_id] = replica_id
        self.sent[replica_id][request_id] = (at, tokens)
