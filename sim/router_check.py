"""The simulator's routers replayed on the Ray Serve router's recorded decisions: would they have sent
each request where the real one did, given the very loads the real replicas had published?

    python -m sim.router_check runs/<vs-peers run>/logs/ray2.routing.jsonl [...]

`make serve-ray ... --record-routing PATH` (and every `ray2`/`ray1` system of benchmarks.vs_peers)
appends one JSON line per routed request: the request's prompt length and targets, each replica's
published load, the prompt lengths sent to each since it published, the real router's ranking and
the replica the request went to. Each simulated router decides from the same line; `slo` must agree
with the real first choice everywhere (they are one function), the others show how often an
SLO-aware choice differs from a load-blind or count-based one. Ties count as agreement.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from adaserve_backend.replica_routing import Job, ReplicaLoad, standing

from .router import ROUTERS, make_router

CHECKED = ("slo", "least_loaded", "round_robin")


@dataclass(frozen=True)
class Decision:
    job: Job
    replicas: list[str]
    loads: list[ReplicaLoad | None]
    sent: list[list[int]]
    first: list[str]  # the real router's first choice (a tier: replicas not published yet are one)
    routed: str  # where the request went (a busy first choice is passed over)


def read(path: Path) -> list[Decision]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        keys = sorted(d["loads"])
        job = Job(**{**d["job"], "prefix_blocks": tuple(d["job"].get("prefix_blocks", ()))})
        out.append(Decision(job, keys, [ReplicaLoad.from_dict(d["loads"][k]) for k in keys],
                            [d["sent"].get(k, []) for k in keys], d["ranked"][0] if d["ranked"] else [], d["routed"]))
    return out


def equivalent(d: Decision, a: int, b: int) -> bool:
    """Replicas `a` and `b` ranked equal for `d` (replica_routing.standing): either was a first choice."""
    return standing(d.job, d.loads[a], d.sent[a]) == standing(d.job, d.loads[b], d.sent[b])


def agreement(decisions: list[Decision], router: str) -> dict:
    r = make_router(router)
    first = routed = 0
    for d in decisions:
        i = r.choose(d.job, d.loads, d.sent)
        first += d.replicas[i] in d.first or any(equivalent(d, i, d.replicas.index(k)) for k in d.first)
        routed += d.replicas[i] == d.routed
    n = max(len(decisions), 1)
    return {"router": router, "decisions": len(decisions), "agrees_with_first_choice": first / n,
            "same_replica_as_routed": routed / n}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sim.router_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--routers", default=",".join(CHECKED))
    args = ap.parse_args(argv)
    names = args.routers.split(",")
    for n in names:
        if n not in ROUTERS:
            ap.error(f"unknown router {n!r}; one of {', '.join(ROUTERS)}")
    print("| log | router | decisions | agrees with the real first choice | same replica as routed |")
    print("|---|---|---|---|---|")
    for path in args.logs:
        decisions = read(path)
        for n in names:
            a = agreement(decisions, n)
            print(f"| {path.name} | {n} | {a['decisions']} | {a['agrees_with_first_choice']:.3f} | "
                  f"{a['same_replica_as_routed']:.3f} |")


if __name__ == "__main__":
    main()
