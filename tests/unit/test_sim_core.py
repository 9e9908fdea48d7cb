"""The simulator's loop: the virtual clock and event order, determinism under a seed, that it runs the
engine's own scheduler and selection code (patching them changes the simulation), and the routers."""

from __future__ import annotations

import pytest

from adaserve_backend.replica_routing import slack
from adaserve_backend.speculation import selection, tree_choice
from sim.clock import EventQueue, Kind
from sim.replica import Replica
from sim.router import LeastLoaded, RoundRobin, SloAware, job_of
from sim.scenario import scenario
from sim.simulator import SimConfig, simulate
from sim.workload import SimRequest, build_requests


def run(policy="adaserve", rps=2.0, duration=20.0, seed=0, replicas=1, router="round_robin", hardware="a100x4"):
    sc = scenario(hardware, "llama70b", policy)
    reqs = build_requests(rps, duration, sc.slos, sc.prompt_scale, seed=seed)
    return simulate(SimConfig(sc.replica, sc.cost, sc.acceptance, replicas, router, seed), reqs)


# ---- the clock ----------------------------------------------------------------------------------
def test_events_come_in_time_order_then_kind_then_push_order():
    q = EventQueue()
    q.push(2.0, Kind.WAKE, "w2")
    q.push(1.0, Kind.WAKE, "w1")
    q.push(1.0, Kind.END, "e1")
    q.push(1.0, Kind.ARRIVAL, "a1")
    q.push(1.0, Kind.ARRIVAL, "a1b")
    got = []
    while q:
        ev = q.pop()
        got.append((q.now, ev.payload))
    assert got == [(1.0, "a1"), (1.0, "a1b"), (1.0, "e1"), (1.0, "w1"), (2.0, "w2")]


def test_the_clock_never_goes_back():
    q = EventQueue()
    q.push(5.0, Kind.END)
    q.pop()
    with pytest.raises(ValueError):
        q.push(4.0, Kind.WAKE)


def test_emitted_times_follow_iterations_on_the_virtual_clock():
    res = run(rps=1.0, duration=10.0)
    for r in res.records:
        assert r.error is None
        assert r.arrival <= r.first_token <= r.last_token <= res.end_s
    assert res.iterations > 0


# ---- determinism --------------------------------------------------------------------------------
def test_same_seed_same_result_other_seed_other_result():
    a, b, c = run(seed=1).summary(), run(seed=1).summary(), run(seed=2).summary()
    assert a == b
    assert a != c


# ---- the engine's own code ----------------------------------------------------------------------
def test_simulation_calls_the_engines_selection(monkeypatch):
    calls = []
    real = tree_choice.choose_trees

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tree_choice, "choose_trees", spy)
    run(rps=1.0, duration=5.0)
    assert calls


def test_changing_the_selection_changes_the_simulation(monkeypatch):
    base = run(rps=2.0, duration=20.0).summary()

    def roots_only(cands, a_caps, params):  # verify no draft token at all
        return [[0] for _ in cands]

    monkeypatch.setattr(tree_choice, "select_tokens", roots_only)
    changed = run(rps=2.0, duration=20.0).summary()
    assert changed["mean_accepted_per_verify"] == 1.0 < base["mean_accepted_per_verify"]
    assert changed["tpot_ms_p50"] > base["tpot_ms_p50"]
    assert selection.select_tokens is not roots_only  # the module under test was the engine's


def test_replicas_run_the_engines_scheduler_and_estimator(monkeypatch):
    from adaserve_backend import engine
    from adaserve_backend.scheduler.scheduler import Scheduler

    assert engine.Scheduler is Scheduler and engine.choose_trees is tree_choice.choose_trees  # what the engine runs
    reps, _ = replicas(1)
    assert type(reps[0].scheduler) is Scheduler and type(reps[0].estimator) is engine.Estimator
    calls = {"schedule": 0, "update": 0}
    for name in calls:
        real = getattr(Scheduler, name)

        def spy(self, *a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(Scheduler, name, spy)
    res = run(rps=1.0, duration=5.0)
    assert calls["schedule"] >= res.iterations > 0 and calls["update"] >= res.iterations


def test_changing_the_scheduler_changes_the_simulation(monkeypatch):
    from adaserve_backend.scheduler.scheduler import Scheduler

    base = run("sarathi", rps=2.0, duration=20.0).summary()
    real = Scheduler.schedule

    def one_at_a_time(self, now):  # a scheduler that decodes at most one request per iteration
        plan = real(self, now)
        del plan.decode[1:]
        return plan

    monkeypatch.setattr(Scheduler, "schedule", one_at_a_time)
    changed = run("sarathi", rps=2.0, duration=20.0).summary()
    assert changed["tpot_ms_p50"] > base["tpot_ms_p50"]


def test_changing_the_depth_control_changes_the_simulation(monkeypatch):
    from adaserve_backend.scheduler import policies

    base = run(rps=1.0, duration=10.0).summary()
    monkeypatch.setattr(policies, "adaptive_depth_width", lambda n, budget, cfg: (1, 1))
    shallow = run(rps=1.0, duration=10.0).summary()
    assert shallow["mean_accepted_per_verify"] < base["mean_accepted_per_verify"]


def test_policies_differ_as_expected_at_light_load():
    ada, cont = run("adaserve", rps=1.0).summary(), run("continuous", rps=1.0).summary()
    assert cont["mean_accepted_per_verify"] == 1.0 and ada["mean_accepted_per_verify"] > 2.5
    assert ada["tpot_ms_p50"] < cont["tpot_ms_p50"] / 2


@pytest.mark.parametrize("policy", ["adaserve", "continuous"])
def test_a_request_ends_where_its_workload_stops_it(policy):
    """SimRequest.stop_after: the simulated model emits its end of sequence there (within a speculative
    iteration's several tokens too) and the engine's output processor ends the request; the scheduler
    still saw max_tokens."""
    sc = scenario("a100x4", "llama70b", policy)
    reqs = [SimRequest(f"r{i}", "chat", 100, 64, 50.0, 2000.0, 0.1 * i, stop)
            for i, stop in enumerate([1, 2, 7, 30, None, 64, 80])]
    res = simulate(SimConfig(sc.replica, sc.cost, sc.acceptance, 1, "round_robin", 0), reqs)
    got = {r.request_id: (r.output_tokens, r.finish_reason) for r in res.records}
    assert got == {"r0": (1, "stop"), "r1": (2, "stop"), "r2": (7, "stop"), "r3": (30, "stop"), "r4": (64, "length"),
                   "r5": (64, "stop"), "r6": (64, "length")}


def test_cpu_scenario_runs_with_the_served_config():
    res = run(rps=0.5, duration=10.0, hardware="cpu").summary()
    assert res["finished"] == res["requests"] > 0


# ---- routers ------------------------------------------------------------------------------------
def replicas(n=2, policy="adaserve"):
    sc = scenario("a100x4", "llama70b", policy)
    import random

    return [Replica(i, sc.replica, sc.cost, sc.acceptance, random.Random(i)) for i in range(n)], sc


def req(i, category="chat", prompt=100, tpot=50.0, ttft=2000.0):
    return SimRequest(f"r{i}", category, prompt, 100, tpot, ttft, 0.0).sequence(i)


def test_round_robin_and_least_loaded():
    reps, _ = replicas(3)
    rr = RoundRobin()
    assert [rr.route(req(i), reps, 0.0).index for i in range(4)] == [0, 1, 2, 0]
    for i in range(3):
        reps[0].add(req(10 + i))
    reps[1].add(req(20))
    assert LeastLoaded().route(req(30), reps, 0.0).index == 2


def test_slo_router_avoids_a_replica_that_cannot_meet_the_first_token_deadline():
    reps, _ = replicas(2)
    for i in range(6):  # replica 0 has ~6k prompt tokens queued: a tight first token cannot make it there
        reps[0].add(req(100 + i, "summary", prompt=1000))
    urgent = req(1, tpot=150.0, ttft=500.0)
    assert slack(job_of(urgent), reps[0].load_at(0.0)) < 0 <= slack(job_of(urgent), reps[1].load_at(0.0))
    assert SloAware().route(req(3, tpot=10.0, ttft=500.0), reps, 0.0).index == 1  # no TPOT fits: least occupied
    assert SloAware().route(urgent, reps, 0.0).index == 1
    # when no replica can meet it, the least occupied is tried
    reps[1].add(req(200, "summary", prompt=500))
    hopeless = req(2, ttft=1.0)
    assert SloAware().route(hopeless, reps, 0.0).index == 1


def test_slo_router_prefers_the_earliest_first_token_of_the_feasible_replicas():
    reps, _ = replicas(2)
    reps[0].add(req(50, prompt=10))
    reps[1].add(req(51, prompt=10))
    reps[1].add(req(52, prompt=10))
    reps[0].add(req(53, prompt=400))  # fewer requests, but more prefill ahead
    assert SloAware().route(req(54, prompt=10, tpot=100.0), reps, 0.0).index == 1


def test_more_replicas_serve_more_load():
    one = run(rps=6.0, duration=30.0).summary()
    two = run(rps=6.0, duration=30.0, replicas=2, router="slo").summary()
    assert two["slo_attainment"] > one["slo_attainment"]


def test_cli_writes_json_and_png(tmp_path):
    import json

    from sim.cli import main

    stem = str(tmp_path / "sweep")
    main(["--policies", "adaserve,continuous", "--rps", "1", "--duration-s", "5", "--out", stem])
    rows = json.load(open(stem + ".json"))["rows"]
    assert {r["policy"] for r in rows} == {"adaserve", "continuous"}
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_a_shared_prompt_hits_the_simulated_prefix_cache():
    """As the served engine's: the second request with the same 400-token prompt prefills only what the
    first left uncached; requests whose prompts are unknown share nothing."""
    import dataclasses

    sc = scenario("cpu", policy="adaserve")
    assert sc.replica.prefix_caching  # the served engine.json's setting

    def ttfts(replica, ids):
        reqs = [SimRequest(f"r{i}", "summary", 400, 8, 250.0, 5000.0, 2.0 * i, None, ids) for i in range(2)]
        res = simulate(SimConfig(replica, sc.cost, sc.acceptance, drain_s=30.0), reqs)
        return [r.first_token - r.arrival for r in res.records]

    ids = tuple(range(3, 403))
    first, second = ttfts(sc.replica, ids)
    assert second < 0.5 * first
    assert ttfts(dataclasses.replace(sc.replica, prefix_caching=False), ids)[1] == pytest.approx(first, rel=0.1)
    assert ttfts(sc.replica, None)[1] == pytest.approx(first, rel=0.1)


def test_slo_router_sends_a_prompt_to_the_replica_holding_its_prefix():
    import random

    sc = scenario("cpu", policy="adaserve")
    reps = [Replica(i, sc.replica, sc.cost, sc.acceptance, random.Random(i)) for i in range(2)]
    ids = tuple(range(3, 403))
    first = SimRequest("r0", "summary", 400, 4, 250.0, 5000.0, 0.0, None, ids)
    reps[1].add(first.sequence(0))
    now = 0.0
    while reps[1].has_work():
        reps[1].begin(now)
        if reps[1].in_flight is not None:
            now = reps[1].in_flight.end
            reps[1].finish()
    again = SimRequest("r1", "summary", 400, 4, 250.0, 5000.0, now, None, ids).sequence(1)
    assert reps[1].load_at(now).holds(job_of(again, sc.replica.block_size)) >= 384
    assert SloAware().route(again, reps, now).index == 1
    other = SimRequest("r2", "summary", 400, 4, 250.0, 5000.0, now, None, None).sequence(2)
    fresh = [Replica(i, sc.replica, sc.cost, sc.acceptance, random.Random(i)) for i in range(2)]
    assert SloAware().route(other, fresh, now).index == 0  # nothing cached, nothing learned: the first of equals


def test_a_repeated_prompt_is_copied_from_the_suffix_index_and_outputs_are_the_true_tokens():
    """As the engine's (speculation/copies.py): the second request with a prompt the first answered
    before gets the first's output as copies, accepted where they are its true tokens; without true
    tokens (or with copies off) nothing is copied."""
    import dataclasses

    sc = scenario("cpu", policy="adaserve")
    ids, truth = tuple(range(3, 103)), tuple(range(500, 540))

    def run_two(copies: bool, continuation, seeds=range(4)):
        """Mean tokens per verification and iterations over a few seeds: two requests' acceptance is a
        handful of random draws, and which depth the estimator trims to moves with them."""
        runs = []
        for seed in seeds:
            reqs = [SimRequest(f"r{i}", "summary", 100, 40, 150.0, 5000.0, 5.0 * i, None, ids,
                               continuation) for i in range(2)]
            replica = dataclasses.replace(sc.replica, copies=copies)
            res = simulate(SimConfig(replica, sc.cost, sc.acceptance, seed=seed, drain_s=30.0), reqs)
            runs.append((res.mean_accepted, res.iterations))
        return sum(a for a, _ in runs) / len(runs), sum(i for _, i in runs)

    copied, copied_iterations = run_two(True, truth)
    plain, plain_iterations = run_two(False, truth)
    assert copied > plain + 0.3 and copied_iterations < plain_iterations
    assert run_two(True, None)[0] == pytest.approx(plain, abs=0.3)


def test_the_replica_emits_the_true_tokens_and_stops_where_the_workload_says():
    import random

    sc = scenario("cpu", policy="adaserve")
    import dataclasses

    rep = Replica(0, dataclasses.replace(sc.replica, copies=True), sc.cost, sc.acceptance, random.Random(0))
    truth = (7, 2, 9, 11, 13)  # 2 is the simulated end of sequence: not where this request stops
    seq = SimRequest("r", "chat", 4, 5, 80.0, 2000.0, 0.0, 4, (3, 4, 5, 6), truth).sequence(0)
    rep.add(seq, 4, truth)
    out, now = [], 0.0
    while rep.has_work():
        out += rep.begin(now)
        if rep.in_flight:
            now = rep.in_flight.end
            out += rep.finish()
    tokens = [t for o in out for t in o.new_token_ids]
    assert tokens[:3] == [7, 1, 9] and len(tokens) == 4
