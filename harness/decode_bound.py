"""The decode-aware bound: the share of a level's requests whose first token and whose last token a
machine could both deliver in time, when it prefills at its peak rate R (prompt tokens per second) and
decodes at its peak rate D (output tokens per second), one after the other on the same machine.

Each request j is two phases of work released at its arrival a_j:
- prefill, p_j / R seconds, due at a_j + TTFT_j (the first token);
- decode, (n_j - 1) / D seconds, due at a_j + TTFT_j + (n_j - 1) * TPOT_j (the last token), n_j its
  output tokens. Joint attainment (harness/metrics.py) needs the first token by a_j + TTFT_j and
  (last - first) / (n_j - 1) <= TPOT_j, so the last token by that time at the latest: a request the
  real run attained meets both deadlines here, never the other way round.
A request of one token (or of unknown length: no decode charged) is its prefill alone.

The machine time-shares (preemptive, switching free): a set of requests is servable iff preemptive
earliest-deadline-first over all their phases meets every deadline (exact for one preemptive machine
with release times). EDF also keeps each request's decode after its prefill: same release, the later
deadline, and prefill first on a tie.

Which requests to serve is chosen as the prefill-only bound (harness/prefill_bound.py) chooses, over
phases: take the phases in deadline order; when the one just added would end late, give up, of the
requests with a phase in the busy period that delays it, the one with the most work (prefill and
decode: its phases share one release, so its decode, even when not yet added, lands in that busy
period too), and repeat until it fits. Every set it keeps is EDF-feasible, so the share is one a
scheduler reaches in this model. It is a heuristic, not the model's optimum, which may be higher
(harness/decode_ceiling.py solves for that): tests/unit/test_decode_bound.py measures how often it
falls short of brute force on small instances, and how rarely a slower D serves one request more.
With D infinite (or no output after the first token) it is the prefill-only bound's algorithm, step
for step. Why R and D make the model optimistic: docs/benchmarking.md.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.prefill_bound import EPS_S, busy_period


@dataclass(frozen=True)
class TwoPhaseJob:
    """One request as the bound sees it."""
    release_s: float  # the request's arrival
    first_deadline_s: float  # arrival + TTFT target
    prompt_tokens: int  # prefilled before the first token
    decode_tokens: int  # output tokens after the first (n - 1); 0 for one token or an unknown length
    tpot_s: float = math.inf  # TPOT target; inf: none

    @property
    def last_deadline_s(self) -> float:
        """When the last token is due: the first's deadline plus the TPOT target per later token."""
        return self.first_deadline_s + (self.decode_tokens * self.tpot_s if self.decode_tokens else 0.0)


@dataclass(frozen=True)
class DecodeBoundResult:
    prefill_tok_s: float
    decode_tok_s: float
    total: int
    on_time: int
    dropped: tuple[int, ...]  # indices into the jobs given, ascending

    @property
    def share(self) -> float:
        """On-time share; 1.0 for no jobs (nothing to miss)."""
        return self.on_time / self.total if self.total else 1.0


@dataclass(frozen=True)
class _Phase:
    release_s: float
    deadline_s: float
    work_s: float
    owner: int  # the job's index
    decode: bool


def job_phases(jobs: Sequence[TwoPhaseJob], prefill_tok_s: float, decode_tok_s: float) -> list[_Phase]:
    """Each job's prefill phase and, where it has decode work, its decode phase. A decode of no work
    (D infinite) is left out: it ends whenever the busy period holding its release does, which is by
    the latest deadline of its members, hence by its own (the prefill's is earlier)."""
    if prefill_tok_s <= 0 or decode_tok_s <= 0:
        raise ValueError(f"the prefill and decode rates must be positive, got {prefill_tok_s} and {decode_tok_s}")
    phases = []
    for i, j in enumerate(jobs):
        phases.append(_Phase(j.release_s, j.first_deadline_s, j.prompt_tokens / prefill_tok_s, i, False))
        decode_s = j.decode_tokens / decode_tok_s
        if decode_s > 0:
            phases.append(_Phase(j.release_s, j.last_deadline_s, decode_s, i, True))
    return phases


def decode_aware_bound(jobs: Sequence[TwoPhaseJob], prefill_tok_s: float,
                       decode_tok_s: float = math.inf) -> DecodeBoundResult:
    """The share of `jobs` served with both deadlines met under the module docstring's policy."""
    phases = job_phases(jobs, prefill_tok_s, decode_tok_s)
    work = [0.0] * len(jobs)
    for ph in phases:
        work[ph.owner] += ph.work_s
    # A job late even alone (its decode waits for its prefill) is in no feasible set: dropping it first
    # keeps it from costing others.
    dropped = {ph.owner for ph in phases
               if ph.release_s + (work[ph.owner] if ph.decode else ph.work_s) > ph.deadline_s + EPS_S}
    release, phase_work = [ph.release_s for ph in phases], [ph.work_s for ph in phases]
    kept: list[int] = []  # indices into phases, sorted by release
    for k in sorted(range(len(phases)), key=lambda k: (phases[k].deadline_s, phases[k].decode, phases[k].owner)):
        owner = phases[k].owner
        if owner in dropped:
            continue
        bisect.insort(kept, k, key=lambda m: (phases[m].release_s, m))
        # k has the latest deadline of the kept phases, so EDF runs it last: the others' schedule is
        # unchanged, and k ends when the busy period that holds its release does.
        while True:
            _, end, members = busy_period(kept, k, release, phase_work)
            if end <= phases[k].deadline_s + EPS_S:
                break
            victim = _most_work(members, phases, work)
            kept[:] = [m for m in kept if phases[m].owner != victim]
            dropped.add(victim)
            if victim == owner:
                break
    return DecodeBoundResult(prefill_tok_s, decode_tok_s, len(jobs), len(jobs) - len(dropped), tuple(sorted(dropped)))


def _most_work(members: list[int], phases: list[_Phase], work: list[float]) -> int:
    """Of the jobs with a phase in the busy period, the one with the most work in all: its decode,
    though not yet added when its prefill is late, is released with it and lands in the same busy
    period. On a tie the latest deadline there, then the highest index (as the prefill-only bound)."""
    latest: dict[int, float] = {}
    for m in members:
        ph = phases[m]
        latest[ph.owner] = max(latest.get(ph.owner, -math.inf), ph.deadline_s)
    return max(latest, key=lambda o: (work[o], latest[o], o))
