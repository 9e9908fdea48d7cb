"""Benchmark scoring and workload construction on hand-made data."""

from __future__ import annotations

import random

import pytest

from client.metrics import RequestRecord, attainment_timeline, percentile, summarize
from client.workload import (
    build_workload,
    fluctuating_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    read_azure_trace,
    rescale_trace,
)


def test_attainment_goodput_and_tpot_exclude_ttft():
    recs = [
        # 10 tokens, first at 1.0 s (TTFT 1 s, ignored), last at 1.9 s: TPOT 100 ms vs SLO 100 ms: attained
        RequestRecord("a", "chat", 100.0, arrival=0.0, first_token=1.0, last_token=1.9, output_tokens=10),
        # TPOT 200 ms vs SLO 100 ms: violated
        RequestRecord("b", "chat", 100.0, arrival=0.0, first_token=0.1, last_token=1.9, output_tokens=10),
        # a single token trivially attains
        RequestRecord("c", "coding", 10.0, arrival=0.0, first_token=0.5, last_token=0.5, output_tokens=1),
        RequestRecord("d", "coding", 10.0, arrival=0.0, error="boom"),
    ]
    assert recs[0].tpot == pytest.approx(0.1) and recs[0].attained and not recs[1].attained
    s = summarize(recs, wall_s=2.0)
    assert s["finished"] == 3 and s["errors"] == 1
    assert s["slo_attainment"] == pytest.approx(2 / 4) and s["violations"] == 2  # the error is a violation
    assert s["goodput_tok_s"] == pytest.approx((10 + 1) / 2.0)
    assert s["throughput_tok_s"] == pytest.approx(21 / 2.0)
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)


def test_attainment_timeline_windows_by_arrival():
    ok = dict(first_token=0.0, last_token=0.0, output_tokens=1)
    recs = [RequestRecord("a", "coding", 10.0, arrival=100.0, **ok), RequestRecord("b", "chat", 10.0, arrival=104.0, error="x"),
            RequestRecord("c", "chat", 10.0, arrival=111.0, **ok)]
    line = attainment_timeline(recs, window_s=5.0)
    assert [w["start_s"] for w in line] == [0.0, 10.0]
    assert line[0]["slo_attainment"] == 0.5 and line[0]["per_category"] == {"chat": 0.0, "coding": 1.0}
    assert line[1]["requests"] == 1 and line[1]["slo_attainment"] == 1.0


def test_trace_is_truncated_and_rescaled(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,100,10\n"
        "2023-11-16 18:17:05.9799600,200,20\n"
        "2023-11-16 18:17:04.9799600,150,15\n"
        "2023-11-16 18:17:13.9799600,10,1\n"
    )
    rows = read_azure_trace(str(path))
    assert [r.context_tokens for r in rows] == [100, 150, 200, 10]
    arrivals = rescale_trace(rows, rps=4.0, n=3)  # 3 arrivals over 2 s of trace -> 2 gaps at 4 rps
    assert arrivals == pytest.approx([0.0, 0.25, 0.5])


def test_arrival_processes_hit_their_rate():
    rng = random.Random(0)
    for arrivals in (poisson_arrivals(5.0, 4000, rng), gamma_arrivals(5.0, 4000, rng)):
        assert len(arrivals) / arrivals[-1] == pytest.approx(5.0, rel=0.1)
    flu = fluctuating_arrivals(4.0, 300.0, ["coding", "chat", "summary"], rng)
    assert len(flu) / 300.0 == pytest.approx(4.0, rel=0.15)
    first_third = [c for t, c in flu if t < 100]
    assert first_third.count("coding") > first_third.count("summary")  # coding peaks first


def test_workload_mix_and_slos():
    prompts = {c: [(f"{c} prompt", False)] for c in ("coding", "chat", "summary")}
    items = build_workload([0.1 * i for i in range(3000)], baseline_tpot_ms=50.0, prompts=prompts, seed=1)
    share = {c: sum(i.category == c for i in items) / len(items) for c in ("coding", "chat", "summary")}
    assert share["coding"] == pytest.approx(0.6, abs=0.03) and share["chat"] == pytest.approx(0.2, abs=0.03)
    slo = {i.category: i.tpot_slo_ms for i in items}
    assert slo == {"coding": 60.0, "chat": 100.0, "summary": 300.0}
    assert all(i.arrival_s == pytest.approx(0.1 * int(i.request_id[1:])) for i in items)


def test_tiny_end_to_end_run_scores_every_request():
    from client.runners import run_inprocess
    from client.workload import WorkItem
    from tests.model_fixtures import tiny_checkpoint
    from tests.unit.test_engine import make_engine

    path = tiny_checkpoint("llama")
    items = [WorkItem(f"t{i}", ["coding", "chat"][i % 2], "unused", False, 6, [5.0, 1e6][i % 2], 0.05 * i) for i in range(8)]
    for policy in ("adaserve", "continuous"):
        engine = make_engine(path, path, policy)
        records, wall = run_inprocess(engine, lambda item: [5, 6, 7, int(item.request_id[1:]) + 10], items, 60)
        s = summarize(records, wall)
        assert s["finished"] == 8 and s["errors"] == 0
        assert all(r.output_tokens >= 1 and r.first_token >= r.arrival for r in records)
        # the 1e6 ms class always attains; the 5 ms class cannot on a CPU engine
        assert summarize([r for r in records if r.category == "chat"], wall)["slo_attainment"] == 1.0
