"""Which engine replica a request goes to. Each replica publishes its load as its own scheduler predicts
it (`measure_load`): when a new request's first token would come, as a function of its prompt length,
and what time per token its decoding requests would get with one more. The router keeps the replicas
predicted to meet both of a request's targets and sends it to the one whose first token would come
soonest (`rank`), after charging each replica with the requests sent to it since it last published.
A replica also names the blocks its prefix cache took most recently, and a request the keys of its
prompt's blocks (`prefix_hints`): the prefix a replica holds is not prefilled again there, so its first
token comes sooner. Pure: the Ray Serve router (ray_serve/router.py) and the simulator's
(sim/router.py) both decide here."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from functools import cached_property

from .kv_cache.block_pool import ROOT_KEY, extend_keys
from .scheduler.deadlines import prefill_left

PROBE_TOKENS = 1024  # the second prompt length the first-token prediction is sampled at (linear between)
HINT_BLOCKS = 2048  # the most recently cached blocks a replica names; older ones are the first evicted anyway


def hint(key: bytes) -> str:
    """A block key as published: 64 bits of it (a collision only misplaces one request's routing)."""
    return key[:8].hex()


def prefix_hints(token_ids, block_size: int, keys: list[bytes] | None = None,
                 root: bytes = ROOT_KEY) -> tuple[str, ...]:
    """The hints of a prompt's full blocks but the one holding its last token (always prefilled).
    `keys`: the block keys known so far, extended in place (as BlockManager.match takes them); `root`:
    the request's scope_root (an isolated tenant's prompt matches only its own blocks)."""
    n = max(len(token_ids) - 1, 0) // block_size
    return tuple(hint(k) for k in extend_keys(keys if keys is not None else [], token_ids, block_size, n, root)[:n])


@dataclass(frozen=True)
class ReplicaLoad:
    running: int
    waiting: int
    max_running: int
    decoding: int
    first_token_s: float | None = None  # predicted first token of a one-token prompt sent now (no cost model: None)
    first_token_s_per_token: float = 0.0  # and each further prompt token's share of it
    tpot_next_s: float | None = None  # predicted time per token of each decoding request with one more
    tightest_tpot_s: float | None = None  # the tightest TPOT target among the running requests
    healthy: bool = True
    at: float = 0.0  # wall-clock time it was measured
    cached_blocks: tuple[str, ...] = ()  # hints of the blocks its prefix cache took most recently

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, stats: dict | None) -> ReplicaLoad | None:
        if not stats:
            return None
        fields = {k: v for k, v in stats.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "cached_blocks": tuple(fields.get("cached_blocks", ()))})

    @cached_property
    def _cached(self) -> frozenset[str]:  # ranked against every request until the next load comes
        return frozenset(self.cached_blocks)

    def holds(self, job: Job) -> int:
        """Prompt tokens of `job` this replica's prefix cache holds (its leading blocks named in both)."""
        if not job.prefix_blocks or not self.cached_blocks:
            return 0
        n = 0
        while n < len(job.prefix_blocks) and job.prefix_blocks[n] in self._cached:
            n += 1
        return n * job.block_size


@dataclass(frozen=True)
class Job:
    """What a router knows of a request: its prompt length and its targets (None: best effort), its
    prompt text (what Ray's prefix-affinity router matches on) and its blocks' hints (prefix_hints)."""

    prompt_tokens: int
    tpot_s: float | None = None
    ttft_s: float | None = None
    prompt: str = ""
    prefix_blocks: tuple[str, ...] = ()
    block_size: int = 0


def measure_load(scheduler, num_waiting: int, unscheduled=(), busy_s: float = 0.0,
                 now: float | None = None) -> ReplicaLoad:
    """A replica's load, read between its steps: `num_waiting` requests not admitted yet, of which
    `unscheduled` not yet handed to the scheduler (their prompts count in the backlog), and `busy_s`
    left of an iteration under way (the simulator's replicas are read mid-iteration)."""
    s, est = scheduler, scheduler.estimator
    n, prefilling = s.prefill_view()
    backlog = sum(prefill_left(q) for q in (*prefilling, *s.waiting, *unscheduled))
    first = per_token = tpot = None
    if est.cost is not None:
        first = est.first_token_s(n, backlog + 1, s.prefill_cap(n))
        per_token = (est.first_token_s(n, backlog + PROBE_TOKENS, s.prefill_cap(n)) - first) / (PROBE_TOKENS - 1)
        first += busy_s
        tpot = est.tpot_at(n + 1)
    targets = [q.planned_tpot_s for q in s.running if q.slo.tpot_ms is not None]
    cached = tuple(hint(k) for k in s.target_blocks.recent_keys(HINT_BLOCKS))
    return ReplicaLoad(len(s.running), num_waiting, s.config.max_num_seqs, n, first, per_token or 0.0, tpot,
                       min(targets) if targets else None, at=time.time() if now is None else now, cached_blocks=cached)


def first_token_s(job: Job, load: ReplicaLoad, sent: list[int] = ()) -> float | None:
    """When `job`'s first token would come on `load`'s replica, behind `sent` (prompt lengths of requests
    sent to it since `load` was measured), its cached prefix not prefilled; None without a cost model."""
    if load.first_token_s is None:
        return None
    return load.first_token_s + load.first_token_s_per_token * (job.prompt_tokens - load.holds(job) - 1 + sum(sent))


def slack(job: Job, load: ReplicaLoad, sent: list[int] = ()) -> float:
    """How far inside both of `job`'s targets `load`'s replica would serve it, the smaller of the two
    relative slacks (negative: a miss predicted; inf: no target, or no prediction to judge by). Its
    decoding also must not push the replica's tightest running request past that one's target."""
    ttft = tpot = math.inf
    if job.ttft_s is not None and (predicted := first_token_s(job, load, sent)) is not None:
        ttft = (job.ttft_s - predicted) / job.ttft_s
    target = min(t for t in (job.tpot_s, load.tightest_tpot_s, math.inf) if t is not None)
    if math.isfinite(target) and load.tpot_next_s is not None:
        # each request sent since adds one more decoding request; scaled as the replica's own prediction grows
        grown = load.tpot_next_s * (load.decoding + 1 + len(sent)) / (load.decoding + 1)
        tpot = (target - grown) / target
    return min(ttft, tpot)


def occupancy(load: ReplicaLoad, sent: list[int] = ()) -> float:
    """Share of the replica's request slots in use or queued for, sent requests included."""
    return (load.running + load.waiting + len(sent)) / max(load.max_running, 1)


def standing(job: Job, load: ReplicaLoad | None, sent: list[int] = ()) -> tuple | None:
    """Where a replica ranks for `job` (lower first; None: never, it is unhealthy): those predicted to
    meet both targets by earliest first token (the least loaded in time: TPOT is already within target
    there, and a prefill backlog is what turns into refusals), then those with no load published yet,
    then those predicted to miss, least occupied first. Without a prediction, least occupied."""
    if load is None:
        return (1,)
    if not load.healthy:
        return None
    first = first_token_s(job, load, sent)
    if slack(job, load, sent) >= 0:
        return (0, math.inf if first is None else first, occupancy(load, sent))
    return (2, occupancy(load, sent))


def rank(job: Job, loads: dict, sent: dict | None = None) -> list[list]:
    """Replica keys in tiers, best first, by `standing`; replicas with no load published share one
    tier; equals keep `loads`' order."""
    sent = sent or {}
    ranked = sorted((st, i, key) for i, (key, load) in enumerate(loads.items())
                    if (st := standing(job, load, sent.get(key, []))) is not None)
    unknown = [key for st, _, key in ranked if st == (1,)]
    tiers = [[key] for st, _, key in ranked if st[0] == 0]
    return tiers + ([unknown] if unknown else []) + [[key] for st, _, key in ranked if st[0] == 2]
