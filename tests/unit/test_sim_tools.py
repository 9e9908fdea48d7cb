"""The simulator's commands: the paper comparison's ratios, the scale-out search, the Azure-like
arrivals and relative SLOs, and the validation against a bench result (its workload rebuilt as the
benchmark builds it)."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from sim import paper, scaleout, validate
from sim.workload import AZURE_CV, arrivals, paper_slos


def row(policy, rps, joint, tpot_only, goodput, requests=100):
    return {"policy": policy, "rps": rps, "slo_attainment": joint, "tpot_slo_attainment": tpot_only,
            "goodput_tok_s": goodput, "tpot_goodput_tok_s": goodput * 1.1, "violations": round(requests * (1 - joint)),
            "tpot_violations": round(requests * (1 - tpot_only))}


def test_ratios_are_over_the_best_baseline_per_metric():
    rows = [row("adaserve", 4, 0.8, 0.9, 200), row("spec:4", 4, 0.4, 0.6, 150), row("continuous", 4, 0.2, 0.3, 160),
            row("adaserve", 1, 1.0, 1.0, 50), row("spec:4", 1, 1.0, 1.0, 50)]
    r1, r4 = paper.compare(rows, "rps")
    assert r1.level == 1 and r1.attainment_x == 1 and r1.fewer_violations_x == 1  # no violations either side
    assert r4.best_baseline == "spec:4" and r4.attainment_x == pytest.approx(2.0)
    assert r4.goodput_x == pytest.approx(200 / 160)  # the best goodput need not be the best attainment's
    assert r4.fewer_violations_x == pytest.approx(60 / 20) and r4.tpot_fewer_violations_x == pytest.approx(40 / 10)
    assert paper.compare([row("adaserve", 2, 0.5, 0.5, 1), row("x", 2, 0.0, 0.0, 0)], "rps")[0].attainment_x == math.inf


@pytest.mark.parametrize("need", [1, 2, 3, 5, 8, 13, 31, 32, 33])
@pytest.mark.parametrize("guess", [1, 4, 40])
def test_scaleout_search_finds_the_fewest_replicas(need, guess):
    calls = []

    def attains(n):
        calls.append(n)
        return n >= need

    assert scaleout.fewest(attains, guess, 32) == (need if need <= 32 else None)
    assert len(calls) <= 2 * math.log2(32) + 2


def test_azure_like_arrivals_have_the_traces_burstiness_and_rate():
    times, cats = arrivals("azure", 5.0, 2000.0, random.Random(0))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert cats is None and len(times) / 2000.0 == pytest.approx(5.0, rel=0.1)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(AZURE_CV, rel=0.15)


def test_azure_trace_replay_uses_the_benchmarks_reader(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{s:02d}.{f}000000,100,10\n" for s, f in [(0, 0), (1, 5), (2, 0), (5, 0), (9, 0)]))
    times, _ = arrivals(f"azure:{path}", 2.0, 100.0, random.Random(0))
    assert times[0] == 0 and len(times) == 5 and (len(times) - 1) / times[-1] == pytest.approx(2.0)


def test_relative_slos_keep_the_papers_order_on_a_slow_baseline():
    absolute, relative = paper_slos(54.0), paper_slos(54.0, mode="relative")
    assert absolute.tpot("chat") < absolute.tpot("coding")  # 50 ms below a 54 ms baseline's 65 ms
    assert relative.tpot("coding") == pytest.approx(1.2 * 54)
    assert relative.tpot("coding") < relative.tpot("chat") < relative.tpot("summary")
    assert paper_slos(54.0, mode="relative", coding_scale=0.8).tpot("coding") == pytest.approx(0.8 * 54)


def test_validation_rebuilds_the_benchmarks_workload():
    from harness.bench import level_items
    from harness.slo_targets import SloTargets
    from harness.workload import PromptDeck

    deck = PromptDeck({c: [("p", True)] for c in ("coding", "chat", "summary")}, repeats=True)
    items = level_items({"rps": 2.0, "urgent_share": 0.8}, 30.0, SloTargets(), deck, 0, 0.5)
    assert len(items) == 60  # harness.bench sends int(rps * duration) Poisson arrivals
    assert sum(i.category == "coding" for i in items) > 40


def test_validation_ends_each_prompt_where_the_measured_runs_stopped_it():
    from harness.workload import WorkItem

    items = {1.0: [WorkItem("w0", "chat", "a", True, 40, 50.0, 0.0), WorkItem("w1", "chat", "b", True, 40, 50.0, 0.5),
                   WorkItem("w2", "chat", "c", False, 40, 50.0, 0.9)],
             2.0: [WorkItem("w0", "chat", "a", True, 20, 50.0, 0.0), WorkItem("w1", "chat", "c", False, 10, 50.0, 0.2)]}
    measured = [{"rps": 1.0, "outputs": {"w0": [12, "stop"], "w1": [40, "length"], "w2": [0, None]}},
                {"rps": 2.0, "outputs": {"w0": [14, "stop"], "w1": [10, "length"]}},
                {"rps": 1.0, "outputs": {"w0": [13, "stop"]}}]
    stops = validate.stop_lengths(measured, lambda lv: items[lv["rps"]])
    assert stops == {("a", True): 13}  # the median of its three stops; a length-capped or unfinished one is unknown
    reqs = validate.sim_requests(items[1.0] + [WorkItem("w3", "chat", "a", True, 10, 50.0, 1.0)],
                                 lambda it: [0] * 5, stops)
    assert [r.stop_after for r in reqs] == [13, None, None, None]  # past w3's max_tokens: it ends by length


def test_paper_command_writes_figure_and_ratios(tmp_path):
    paper.main(["rps", "--rps", "1,3", "--duration-s", "10", "--policies", "adaserve,spec:4", "--out", str(tmp_path)])
    out = json.load(open(tmp_path / "paper-rps.json"))
    assert {r["policy"] for r in out["rows"]} == {"adaserve", "spec:4"} and len(out["ratios"]) == 2
    assert out["meta"]["paper_llama70b"]["attainment_x"] == 2.1 and (tmp_path / "paper-rps.png").stat().st_size > 0


def tokenless_bench(tmp_path, monkeypatch, rows: list[dict]):
    """A bench JSON of `rows` (in-process, the served config) and InProcess without the tokenizer
    (every prompt 40 tokens): (its path, its content)."""
    import dataclasses

    import harness.bench
    from harness.slo_targets import SloTargets

    class Tokenless:
        def __init__(self, config):
            pass

        def encode(self, item):
            return [0] * 40

    monkeypatch.setattr(harness.bench, "InProcess", Tokenless)
    bench = {"suite": "quick", "target": "inprocess",
             "slo_targets": dataclasses.asdict(SloTargets()), "duration_s": 10.0,
             "config": "model_repository/adaserve/1/engine.json", "sweep": "rps", "rows": rows}
    path = tmp_path / "quick-rps.json"
    path.write_text(json.dumps(bench))
    return path, bench


def test_validate_command_against_a_bench_json(tmp_path, monkeypatch):
    rows = [{"rps": 1.0, "policy": p, "requests": 10, "slo_attainment": 1.0,
             "tpot_slo_attainment": 1.0, "tpot_ms_p50": 15.0}
            for p in ("adaserve", "continuous")]
    path, bench = tokenless_bench(tmp_path, monkeypatch, rows)
    validate.main([str(path), "--no-copies", "--out", str(tmp_path / "v")])
    checks = json.load(open(tmp_path / "v.json"))["checks"]
    assert [c["policy"] for c in checks] == ["adaserve", "continuous"]
    assert all(c["predicted_joint"] is not None and c["predicted_tpot_p50_ms"] > 0 for c in checks)
    # the same runs, recorded on a machine running at half the profile's speed: priced for it
    profile = validate.CostModel.load("model_repository/adaserve/1/profile-cpu.json")
    for r in rows:
        r["speed_probe_ms"] = {str(n): 2 * profile.verify_ms(n) for n in (1, 16)}
    path.write_text(json.dumps({**bench, "rows": rows}))
    validate.main([str(path), "--no-copies", "--out", str(tmp_path / "slow")])
    slow = json.load(open(tmp_path / "slow.json"))
    assert [r["machine_speed"] for r in slow["rows"]] == pytest.approx([2.0, 2.0])
    for fast_check, slow_check in zip(checks, slow["checks"]):
        assert slow_check["predicted_tpot_p50_ms"] > 1.5 * fast_check["predicted_tpot_p50_ms"]
    # runs that recorded their iterations are priced by a fit to the other levels' runs (here: 100 ms steps)
    rows[1] |= {"rps": 2.0, "requests": None}
    for r in rows:
        r.pop("speed_probe_ms")
        r["iterations"] = [{"n": n, "depth": 0, "width": 0, "verified": n, "prefill": 0,
                            "prefills": 0, "context": 60 * n,
                            "chain": 0, "spec_ms": 0.0, "step_ms": 100.0} for n in range(1, 11)]
    path.write_text(json.dumps({**bench, "rows": rows}))
    validate.main([str(path), "--no-copies", "--out", str(tmp_path / "in-run")])
    in_run = json.load(open(tmp_path / "in-run.json"))
    assert in_run["meta"]["step_cost"] == "in-run"
    for fast_check, slow_check in zip(checks, in_run["checks"]):  # 100 ms steps, of 1.8 tokens where speculating
        assert slow_check["predicted_tpot_p50_ms"] > 2 * fast_check["predicted_tpot_p50_ms"]
    # priced by another bench's iterations (a calibration run: 50 ms steps), none of this one's; the run
    # judged against itself as a repeat is within the bar everywhere
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({**bench,
                                       "rows": [{**r, "iterations": [{**it, "step_ms": 50.0} for it in r["iterations"]]}
                                                          for r in rows]}))
    validate.main([str(path), "--fit-from", str(calibration), "--repeat", str(path), "--no-copies",
                   "--out", str(tmp_path / "cal")])
    cal = json.load(open(tmp_path / "cal.json"))
    assert cal["meta"]["step_cost"] == "calibration"
    for in_run_check, cal_check in zip(in_run["checks"], cal["checks"]):
        assert cal_check["predicted_tpot_p50_ms"] < 0.75 * in_run_check["predicted_tpot_p50_ms"]
    assert [c["within"] for c in cal["repeat_checks"]] == [True, True]
    # the runs' speed read off their own steps (100 ms where the calibration's fit prices 50): twice the
    # fit's, priced as the calibration-only run above read at twice the speed; and at +-10% beside it
    validate.main([str(path), "--fit-from", str(calibration), "--speed", "steps", "--speed-band", "0.1", "--no-copies",
                   "--out", str(tmp_path / "steps")])
    steps = json.load(open(tmp_path / "steps.json"))
    assert [r["machine_speed"] for r in steps["rows"]] == pytest.approx([2.0, 2.0], rel=0.02)
    assert steps["meta"]["speed"] == "steps" and steps["meta"]["acceptance_factor"] is None  # nothing speculated
    assert [r["machine_speed"] for r in steps["speed_band"]["1.1"]] == pytest.approx([2.2, 2.2], rel=0.02)
    for cal_check, steps_check in zip(cal["checks"], steps["checks"]):
        assert steps_check["predicted_tpot_p50_ms"] > 1.5 * cal_check["predicted_tpot_p50_ms"]
    # a calibration run that speculated: the acceptance table is scaled to its tokens per verification
    for accepted in (1.3, 2.5):
        rows_ = json.load(open(calibration))["rows"]
        calibration.write_text(json.dumps({**bench, "rows": [{**r, "mean_accepted_per_verify": accepted
                                                              if r["policy"] == "adaserve" else 1.0}
                                                              for r in rows_]}))
        validate.main([str(path), "--fit-from", str(calibration), "--no-copies", "--out",
                       str(tmp_path / f"acc{accepted}")])
    low, high = (json.load(open(tmp_path / f"acc{a}.json")) for a in (1.3, 2.5))
    assert 0.25 < low["meta"]["acceptance_factor"] < high["meta"]["acceptance_factor"] < 2.0
    assert [r["mean_accepted_per_verify"] for r in low["rows"]][0] < [r["mean_accepted_per_verify"]
                                                                      for r in high["rows"]][0]


def test_relative_speed_is_the_geometric_mean_of_the_probes_over_the_profile():
    profile = validate.CostModel.load("model_repository/adaserve/1/profile-cpu.json")
    probe = {"1": 1.21 * profile.verify_ms(1), "16": profile.verify_ms(16)}
    assert profile.relative_speed(probe) == pytest.approx(1.1)
    assert profile.relative_speed({}) == 1.0


def test_scheduler_settings_reach_every_replica():
    from sim.options import Deploy, scheduler_settings

    pairs = scheduler_settings("overload=best_effort,slo_admission=false,max_num_seqs=32,admission_headroom=1.0")
    assert pairs == (("overload", "best_effort"), ("slo_admission", False), ("max_num_seqs", 32),
                     ("admission_headroom", 1.0))
    sched = Deploy("a100x4", "llama70b", None, 1.3, "relative", pairs).scenario("adaserve").replica.scheduler
    assert (sched.overload, sched.slo_admission, sched.max_num_seqs) == ("best_effort", False, 32)


def test_validate_judges_a_repeated_bench_by_its_bands(tmp_path, monkeypatch):
    rows = [{"rps": 1.0, "repeat": k, "policy": "continuous", "requests": 10, "slo_attainment": a,
             "tpot_slo_attainment": a,
             "tpot_ms_p50": 15.0} for k, a in enumerate((0.9, 1.0, 1.0))]
    path, _ = tokenless_bench(tmp_path, monkeypatch, rows)
    validate.main([str(path), "--step-cost", "profile", "--no-copies", "--out", str(tmp_path / "v")])
    out = json.load(open(tmp_path / "v.json"))
    assert [r["repeat"] for r in out["rows"]] == [0, 1, 2] and len(out["checks"]) == 3
    (b,) = out["bands"]
    assert b["measured"] == [0.9, 1.0, 1.0] and len(b["predicted"]) == 3 and b["lo"] == 0.9 and b["median"] == 1.0
    assert {"inside", "no_worse", "rerun_error", "sim_error"} <= set(b)
