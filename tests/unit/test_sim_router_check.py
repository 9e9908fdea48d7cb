"""sim/router_check.py: recorded routing decisions replayed through the simulator's routers. The log is
written here as the Ray Serve router writes it (ray_serve/router.py), ranked by replica_routing.rank."""

from __future__ import annotations

import json
from dataclasses import asdict

from adaserve_backend.replica_routing import Job, ReplicaLoad, rank
from sim.router_check import agreement, main, read


def load(running, first, at=10.0):
    return ReplicaLoad(running, 0, 16, running, first, 0.001, 0.03, None, True, at)


def line(job: Job, loads: dict, sent: dict) -> str:
    tiers = rank(job, loads, sent)
    return json.dumps({"at": 11.0, "job": asdict(job), "ranked": tiers, "routed": tiers[0][0],
                       "loads": {k: None if v is None else v.as_dict() for k, v in loads.items()}, "sent": sent})


def test_the_slo_router_replays_every_decision_and_the_others_differ(tmp_path, capsys):
    job = Job(200, 0.05, 1.0)
    lines = [  # a: fewer requests but a later first token; b: unpublished yet; c: equal to a
        line(job, {"a": load(1, 0.5), "b": load(3, 0.1)}, {}),
        line(job, {"a": load(1, 0.1), "b": load(3, 0.1)}, {"a": [900, 900]}),
        line(job, {"a": load(0, 0.1), "b": None}, {}),
        line(Job(10), {"a": load(4, 0.1), "b": load(2, 0.1)}, {"b": [10, 10, 10]}),
    ]
    log = tmp_path / "ray2.routing.jsonl"
    log.write_text("\n".join(lines) + "\n")
    decisions = read(log)
    assert [d.first for d in decisions] == [["b"], ["b"], ["a"], ["a"]]
    assert agreement(decisions, "slo")["agrees_with_first_choice"] == 1.0
    assert agreement(decisions, "least_loaded")["agrees_with_first_choice"] < 1.0
    main([str(log)])
    table = capsys.readouterr().out
    assert "| ray2.routing.jsonl | slo | 4 | 1.000 |" in table
