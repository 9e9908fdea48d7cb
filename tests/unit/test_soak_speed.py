"""The soak's mirrored last window (benchmarks/soak_plan.py) and its speed check (benchmarks/soak_speed.py)."""

from __future__ import annotations

import pytest

from benchmarks.soak_plan import FramedDeck, Shares, build_plan
from benchmarks.soak_records import HOSTILE, ServerSample
from benchmarks.soak_sampler import tree_cpu_s
from benchmarks.soak_speed import machine_cpu, series_values, speed_by_window

PROMPTS = {"coding": [(f"def f{i}(x):\n    '''Return x.'''\n", False) for i in range(60)],
           "chat": [(f"What is question {i}?", True) for i in range(30)],
           "summary": [(f"Summarize text {i}.", True) for i in range(30)]}


def test_the_last_window_replays_the_first_with_prompts_reframed():
    deck = FramedDeck(PROMPTS, seed=0)
    plan = build_plan(2.0, 300.0, Shares(0.3, 0.1, 0.05), seed=4, deck=deck, mirror_s=60.0)
    first = [p for p in plan if p.arrival_s < 60]
    last = [p for p in plan if p.arrival_s >= 240]
    assert len(first) == len(last) > 50
    assert [p.arrival_s for p in plan] == sorted(p.arrival_s for p in plan)
    assert len({p.request_id for p in plan}) == len(plan)
    for a, b in zip(first, last, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s + 240)
        assert (a.kind, a.category, a.chat, a.max_tokens, a.leave_after) == (b.kind, b.category, b.chat,
                                                                             b.max_tokens, b.leave_after)
        if a.kind != HOSTILE:
            assert a.prompt != b.prompt
            assert a.prompt[-12:] == b.prompt[-12:]  # the same question, framed otherwise
    texts = [p.prompt for p in plan if p.kind != HOSTILE]
    assert len(set(texts)) == len(texts)  # still no text sent twice


def test_without_a_mirror_the_plan_is_unchanged_and_a_mirror_must_fit():
    a = build_plan(2.0, 300.0, seed=4, deck=FramedDeck(PROMPTS, seed=0))
    b = build_plan(2.0, 300.0, seed=4, deck=FramedDeck(PROMPTS, seed=0), mirror_s=0.0)
    assert a == b
    with pytest.raises(ValueError):
        build_plan(2.0, 300.0, seed=4, deck=FramedDeck(PROMPTS, seed=0), mirror_s=200.0)


def test_series_are_read_by_their_labels():
    text = "\n".join([
        "# HELP adaserve_step_seconds_total Decode steps' wall time",
        'adaserve_step_seconds_total{part="target_forward"} 12.5',
        'adaserve_step_seconds_total{part="rest"} 2.5',
        "adaserve_steps_total 1000",
        "adaserve_step_time_measured_over_predicted_sum{} 1010",
        "adaserve_step_time_measured_over_predicted_count 1000",
        'adaserve_step_time_measured_over_predicted_bucket{le="1.05"} 900',
        "adaserve_generation_tokens_total 5000",
        "adaserve_suffix_index_tokens 4096"])
    assert series_values(text) == {"target_forward_s": 12.5, "rest_s": 2.5, "steps": 1000, "ratio_sum": 1010,
                                   "ratio_count": 1000, "tokens": 5000, "suffix_tokens": 4096}


def at(t: float, k: float, steal: float = 0.0) -> ServerSample:
    """A sample at `t` after k units of steady work (the forward 10 ms a step, the rest 2 ms)."""
    counters = {"steal_jiffies": steal, "all_jiffies": 200 * t, "target_forward_s": 10 * k, "rest_s": 2 * k,
                "steps": 1000 * k, "ratio_sum": 1000 * k, "ratio_count": 1000 * k, "tokens": 4000 * k,
                "triton_cpu_s": 20 * k}
    return ServerSample(t, 1000.0, {}, 100.0, 0, 0, 0, counters)


def test_speed_per_window_tells_a_slower_machine_from_a_slower_server():
    samples = [at(0, 0), at(60, 1), at(120, 2), at(180, 2.5, steal=6000)]
    rows = speed_by_window(samples, 180.0, 60.0)
    assert [r["start_s"] for r in rows] == [0, 60, 120]
    assert rows[0] == {"start_s": 0, "end_s": 60, "steal_share": 0.0, "target_forward_ms_per_step": 10.0,
                       "rest_ms_per_step": 2.0, "measured_over_predicted": 1.0, "server_cpu_ms_per_token": 5.0,
                       "steps_per_s": 16.7, "suffix_tokens": None, "rss_mib_median": 1000.0}
    assert rows[2]["steal_share"] == 0.5 and rows[2]["steps_per_s"] == pytest.approx(8.3)
    assert speed_by_window([ServerSample(0, 0, {}, 1, 0, 0, 0)], 60.0, 30.0) == [
        {"start_s": 0, "end_s": 30}, {"start_s": 30, "end_s": 60}]  # nothing read: nothing said


def test_this_machine_and_process_are_read():
    cpu = machine_cpu()
    assert not cpu or cpu["all_jiffies"] >= cpu["steal_jiffies"] >= 0
    import os
    assert tree_cpu_s(os.getpid()) > 0
