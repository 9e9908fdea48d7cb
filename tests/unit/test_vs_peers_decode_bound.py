"""The side-by-side benchmark's decode-aware bound, without servers or a model: a run's requests as
two-phase jobs with that run's output lengths, the row fields, the report's columns and plot, and the
peak decode rate's plumbing."""

from __future__ import annotations

import math

import pytest

from adaserve_backend.config import EngineConfig
from benchmarks import decode_rate
from benchmarks.one_request import ENGINE_JSON
from benchmarks.vs_peers_levels import build_levels, decode_bound_fields, decode_jobs
from benchmarks.vs_peers_report import markdown_table, plot
from benchmarks.vs_peers_windows import aggregate
from harness.decode_bound import decode_aware_bound
from harness.decode_ceiling import decode_aware_ceiling
from harness.metrics import RequestRecord
from harness.slo_targets import SloTargets
from tests.unit.test_vs_peers_windows import WordTokenizer, deck, rows_for


def level():
    return build_levels("poisson", [2.0], 10.0, 1, SloTargets(), deck(), 0, 0.5, WordTokenizer())[0]


def record(it, outputs: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(it.request_id, it.category, it.tpot_slo_ms, it.arrival_s, first_token=it.arrival_s + 0.1,
                         last_token=it.arrival_s + 1.0, output_tokens=outputs, error=error,
                         ttft_slo_ms=it.ttft_slo_ms, finish_reason=None if error else "stop")


def test_a_runs_requests_carry_its_own_output_lengths():
    lv = level()
    # the records in another order than sent; the second request unfinished (a time-out): no length known
    records = [record(it, 10 + i, error="time limit" if i == 1 else None) for i, it in enumerate(lv.items)][::-1]
    jobs = decode_jobs(lv, records)
    it = lv.items[0]
    assert jobs[0].release_s == it.arrival_s and jobs[0].first_deadline_s == it.arrival_s + it.ttft_slo_ms / 1e3
    assert jobs[0].prompt_tokens == lv.prompt_tokens[0] and jobs[0].decode_tokens == 9
    assert jobs[0].last_deadline_s == pytest.approx(jobs[0].first_deadline_s + 9 * it.tpot_slo_ms / 1e3)
    assert jobs[1].decode_tokens == 0 and jobs[1].last_deadline_s == jobs[1].first_deadline_s
    assert [j.decode_tokens for j in jobs[2:]] == [10 + i - 1 for i in range(2, len(jobs))]
    missing = decode_jobs(lv, records[:-1])  # no record of the first request at all
    assert missing[0].decode_tokens == 0


def test_row_fields_and_free_decoding():
    lv = level()
    records = [record(it, 40) for it in lv.items]
    fast = decode_bound_fields(lv, records, 1e6, math.inf, 0.5)
    assert fast == {"bound_decode": 1.0, "over_bound_decode": 0.5, "bound_decode_exact": True,
                    "bound_decode_policy": 1.0, "bound_decode_dropped": []}
    # 2 output tokens a second: 39 tokens take 20 s, beyond any TPOT target here
    slow = decode_bound_fields(lv, records, 1e6, 2.0, 0.0)
    assert slow["bound_decode"] == 0.0 and slow["over_bound_decode"] is None
    assert len(slow["bound_decode_dropped"]) == len(lv.items)
    assert slow["bound_decode_dropped"][0] == lv.items[0].request_id
    # a share no schedule beats, at least what the dropping heuristic reaches
    jobs = decode_jobs(lv, records)
    for rate in (400.0, 100.0, 40.0):
        mid = decode_bound_fields(lv, records, 1e6, rate, 0.25)
        assert mid["bound_decode"] == decode_aware_ceiling(jobs, 1e6, rate).share
        assert mid["bound_decode_policy"] == decode_aware_bound(jobs, 1e6, rate).share <= mid["bound_decode"]
        assert mid["bound_decode_exact"]
        assert len(mid["bound_decode_dropped"]) == round(len(jobs) * (1 - mid["bound_decode"]))


def with_decode_bound(rows: list[dict]) -> list[dict]:
    return [{**r, "bound_decode": r["bound"] - 0.1, "over_bound_decode": r["slo_attainment"] / (r["bound"] - 0.1)}
            for r in rows]


def test_the_table_and_plot_show_both_bounds(tmp_path):
    rows = with_decode_bound(rows_for(3))
    agg = {(r["system"], r["rps"]): r for r in aggregate(rows)}
    assert agg[("adaserve", 1.0)]["bound_decode"] == pytest.approx(0.8)
    assert agg[("adaserve", 1.0)]["spread"]["bound_decode"] == pytest.approx((0.7, 0.9))
    table = markdown_table(rows)
    assert table.splitlines()[0].endswith(
        "| prefill-only bound | joint / bound | decode-aware bound | joint / decode bound |")
    assert "| 0.90 (0.80-1.00) | " in table and "| 0.80 (0.70-0.90) | " in table
    assert "decode-aware" not in markdown_table(rows_for(3))  # a run from before it: no columns
    plot(rows, str(tmp_path / "both.png"))
    assert (tmp_path / "both.png").stat().st_size > 10_000


def test_the_peak_decode_rate_is_the_fastest_shape_on_the_served_model(monkeypatch):
    import torch

    import adaserve_backend.model_runner as model_runner
    import adaserve_backend.models as models
    import adaserve_backend.models.kernel_choice as kernel_choice
    import adaserve_backend.profiler as profiler

    timed, chosen = [], []

    class Blocks:
        num_free_blocks = 24  # room for 24 sequences of one block each

        def blocks_for(self, tokens):
            return -(-tokens // 128)

    class Runner:
        blocks = Blocks()

        def __init__(self, model, cache):
            self.model, self.cache = model, cache

    def measure_forward(runner, sizes, per_seq, context, repeats, desc=""):
        timed.append((per_seq, list(sizes), context))
        return {n: 10.0 + 0.5 * n for n in sizes}  # a fixed cost, then 0.5 ms a position

    monkeypatch.setattr(models, "load_model", lambda cfg: cfg)
    monkeypatch.setattr(model_runner, "ModelRunner", Runner)
    monkeypatch.setattr(profiler, "measure_forward", measure_forward)
    monkeypatch.setattr(kernel_choice, "apply", lambda model, config: chosen.append((model, config)))
    threads = torch.get_num_threads()
    rate = decode_rate.measure_decode_rate(repeats=1)
    # timed with the kernels the server would choose on this machine, not the default one
    served = EngineConfig.from_json(str(ENGINE_JSON))
    assert chosen == [(served.target, served.kernels)]
    # engine.json: max_num_seqs 32, token_budget 256; the cache holds 24 sequences, so 32 and 32x8 go
    assert timed == [(1, [1, 8, 16], decode_rate.CONTEXT), (8, [8, 64, 128], decode_rate.CONTEXT)]
    assert set(rate.per_shape) == {"1x1", "8x1", "16x1", "1x8", "8x8", "16x8"}
    assert rate.tok_s == pytest.approx(128 / 0.074) == rate.per_shape["16x8"]
    assert rate.dtype == "bfloat16" and rate.measured and torch.get_num_threads() == threads
    assert rate.to_dict()["per_shape"]["1x1"] == pytest.approx(1 / 0.0105)
    assert "16x8" in decode_rate.describe(rate)
    given = decode_rate.given_rate(500.0)
    assert given.tok_s == 500.0 and not given.measured and "given" in decode_rate.describe(given)
    with pytest.raises(ValueError, match="positive"):
        decode_rate.given_rate(0.0)


def test_shapes_stay_within_the_schedulers_limits():
    assert decode_rate.shapes(32, 256) == {1: [1, 8, 16, 32], 8: [8, 64, 128, 256]}
    assert decode_rate.shapes(4, 1024) == {1: [1, 4], 8: [8, 32]}
    assert decode_rate.shapes(64, 4) == {1: [1, 8, 16, 64]}  # no tree fits the budget
