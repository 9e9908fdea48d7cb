"""The side-by-side benchmark's windows and prefill-only bound, without servers or a model: levels of K
windows from one prompt deck, each row's window fields, the report's aggregation over windows, the
plot, and the peak prefill rate's plumbing."""

from __future__ import annotations

import pytest

from benchmarks import prefill_rate
from benchmarks.vs_peers_levels import (
    arrivals_for,
    bound_jobs,
    build_levels,
    describe_levels,
    level_fields,
    level_meta,
    with_bounds,
)
from benchmarks.vs_peers_report import best_of_each, capacity, markdown_table, plot
from benchmarks.vs_peers_windows import aggregate, window_lines
from harness.slo_targets import SloTargets
from harness.trace_windows import NAMED_TRACES, TRACES_ENV
from harness.workload import PromptDeck, PromptsExhausted, repeat_share


class WordTokenizer:
    """One token per word; a chat template that wraps the text, as a real template adds its own tokens."""
    chat_template = "wrap"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return f"<user> {messages[0]['content']} <assistant>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(range(len(text.split())))}


def deck(per_category: int = 60, seed: int = 0) -> PromptDeck:
    prompts = {c: [(f"{c} prompt number {i} " + "word " * (i % 9), c == "chat") for i in range(per_category)]
               for c in ("coding", "chat", "summary")}
    return PromptDeck(prompts, seed)


def test_each_window_is_its_own_requests_from_the_one_deck():
    levels = build_levels("poisson", [1.0, 2.0], duration_s=5.0, windows=3, slos=SloTargets(), deck=deck(),
                          seed=10, output_scale=0.5, tokenizer=WordTokenizer())
    assert [(lv.rps, lv.window) for lv in levels] == [(1.0, 0), (1.0, 1), (1.0, 2), (2.0, 0), (2.0, 1), (2.0, 2)]
    assert [lv.seed for lv in levels] == [10, 11, 12, 13, 14, 15]
    assert [len(lv.items) for lv in levels] == [5, 5, 5, 10, 10, 10]
    assert repeat_share([it for lv in levels for it in lv.items]) == 0.0  # no prompt twice to one server
    assert levels[0].items != levels[1].items
    for lv in levels:
        assert lv.items[0].arrival_s > 0 and 1 <= lv.peak_5s <= len(lv.items)
        assert not any(it.chat for it in lv.items)  # chat prompts rendered to text
        assert lv.prompt_tokens == tuple(len(it.prompt.split()) for it in lv.items)
    chat = next(it for lv in levels for it in lv.items if it.category == "chat")
    assert chat.prompt.startswith("<user> chat prompt")
    # one window is the level as it was before windows: seed + level index
    single = build_levels("poisson", [1.0, 2.0], 5.0, 1, SloTargets(), deck(), 10, 0.5, WordTokenizer())
    assert [lv.seed for lv in single] == [10, 11]
    assert single[0].items[0].arrival_s == arrivals_for("poisson", 1.0, 5, 10)[0]
    with pytest.raises(PromptsExhausted):
        build_levels("poisson", [10.0], 60.0, 2, SloTargets(), deck(per_category=20), 0, 0.5, WordTokenizer())
    with pytest.raises(ValueError, match="at least 1"):
        build_levels("poisson", [1.0], 5.0, 0, SloTargets(), deck(), 0, 0.5, WordTokenizer())


def test_trace_windows_per_level(tmp_path, monkeypatch):
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.{(i * 37) % 100:02d}00000,100,10" for i in range(600)]
    (tmp_path / NAMED_TRACES["azure-conv"]).write_text("\n".join(lines) + "\n")
    levels = build_levels("azure-conv", [2.0], 10.0, 2, SloTargets(), deck(), 0, 0.5, WordTokenizer())
    assert [len(lv.items) for lv in levels] == [20, 20]
    for lv in levels:
        assert lv.items[0].arrival_s == 0.0 and lv.items[-1].arrival_s == pytest.approx(19 / 2.0)
    with pytest.raises(FileNotFoundError, match="azure-code"):
        build_levels("azure-code", [2.0], 10.0, 1, SloTargets(), deck(), 0, 0.5, WordTokenizer())


def test_the_bound_of_a_window_and_the_row_fields():
    levels = build_levels("poisson", [2.0], 10.0, 2, SloTargets(), deck(), 0, 0.5, WordTokenizer())
    jobs = bound_jobs(levels[0])
    it = levels[0].items[0]
    assert jobs[0].release_s == it.arrival_s and jobs[0].deadline_s == it.arrival_s + it.ttft_slo_ms / 1e3
    assert jobs[0].tokens == levels[0].prompt_tokens[0]
    fast, slow = with_bounds(levels, 1e6), with_bounds(levels, 2.0)  # prompts of ~5-16 words, 2 tok/s: late
    assert all(lv.bound.share == 1.0 for lv in fast)
    assert all(lv.bound.share < 0.5 for lv in slow)
    row = level_fields(fast[1], 0.75)
    assert row == {"window": 1, "window_seed": 1, "peak_5s": fast[1].peak_5s, "bound": 1.0, "over_bound": 0.75}
    assert level_fields(levels[0], 0.5)["over_bound"] is None  # no rate, no bound
    meta = level_meta(slow[0])
    assert meta["requests"] == 20 and len(meta["bound_dropped"]) == 20 - slow[0].bound.on_time
    assert "peak arrivals in 5 s per window" in describe_levels(slow)[0] and "bound" in describe_levels(slow)[0]


def rows_for(windows: int, with_bound: bool = True) -> list[dict]:
    base = dict(tpot_slo_attainment=0.9, goodput_tok_s=10.0, ttft_ms_p50=250.0, ttft_ms_p99=2500.0,
                tpot_ms_p50=40.0, tpot_ms_p99=60.0, errors=1, requests=10)
    rows = []
    for rps, bounds in ((1.0, (1.0, 0.9, 0.8)), (2.0, (0.8, 0.6, 0.7))):
        for w in range(windows):
            for system, att in (("adaserve", 0.7 + 0.1 * w), ("vllm", 0.4 + 0.1 * w)):
                att = att if rps == 1.0 else att - 0.2
                row = {"system": system, "rps": rps, "window": w, "peak_5s": int(10 * rps) + w, **base,
                       "slo_attainment": att}
                if with_bound:
                    row |= {"bound": bounds[w], "over_bound": att / bounds[w]}
                rows.append(row)
    return rows


def test_windows_aggregate_to_mean_and_spread_per_system_and_level():
    agg = aggregate(rows_for(3))
    assert len(agg) == 4
    ours = next(r for r in agg if r["system"] == "adaserve" and r["rps"] == 1.0)
    assert ours["windows"] == 3 and ours["slo_attainment"] == pytest.approx(0.8)
    assert ours["spread"]["slo_attainment"] == pytest.approx((0.7, 0.9))
    assert ours["bound"] == pytest.approx(0.9) and ours["spread"]["bound"] == pytest.approx((0.8, 1.0))
    assert ours["over_bound"] == pytest.approx((0.7 / 1.0 + 0.8 / 0.9 + 0.9 / 0.8) / 3)
    assert ours["errors"] == 3 and ours["requests"] == 30 and ours["peak_5s"] == [10, 11, 12]
    assert aggregate(aggregate(rows_for(3))) == agg  # aggregated rows pass through
    single = aggregate(rows_for(1))
    assert len(single) == 4 and single[0]["windows"] == 1 and "spread" not in single[0]


def test_the_table_shows_the_bound_and_the_spread_over_windows():
    table = markdown_table(rows_for(3))
    head, *_, last = table.splitlines()
    assert head.endswith("| errors | prefill-only bound | joint / bound |")
    assert "| adaserve | 1 | 0.80 (0.70-0.90) |" in table
    assert "| 0.90 (0.80-1.00) |" in table and "| 3/30 |" in table
    assert len(table.splitlines()) == 2 + 4
    plain = markdown_table(rows_for(1, with_bound=False))
    assert "bound" not in plain and "| adaserve | 1 | 0.70 | 0.90 | 10.0 |" in plain
    one = markdown_table(rows_for(1))
    assert "| adaserve | 1 | 0.70 |" in one and "| 1.00 | 0.70 |" in one  # one window: no spread


def test_best_of_each_and_capacity_over_windows():
    rows = rows_for(3) + [{**r, "system": "vllm-ngram", "slo_attainment": r["slo_attainment"] + 0.05}
                          for r in rows_for(3) if r["system"] == "vllm"]
    best = {(r["system"], r["rps"]): r for r in best_of_each(rows)}
    assert set(best) == {("adaserve", 1.0), ("adaserve", 2.0), ("vllm-ngram", 1.0), ("vllm-ngram", 2.0)}
    assert best[("vllm-ngram", 1.0)]["slo_attainment"] == pytest.approx(0.55)
    assert "| vllm-ngram | 1 | 0.55 (0.45-0.65) |" in markdown_table(best_of_each(rows))
    cap = capacity(rows_for(3), target=0.75)
    assert cap["adaserve"] == {"capacity_rps": 1.0, "bracketed": True}  # means 0.8 then 0.6
    assert cap["vllm"] == {"capacity_rps": 0.0, "bracketed": True}


def test_window_summary_and_plot(tmp_path, capsys):
    lines = window_lines(rows_for(3))
    assert lines == ["1 rps: peak arrivals in 5 s per window 10, 11, 12 (mean 5); "
                     "prefill-only bound 1.00, 0.90, 0.80",
                     "2 rps: peak arrivals in 5 s per window 20, 21, 22 (mean 10); "
                     "prefill-only bound 0.80, 0.60, 0.70"]
    from benchmarks.vs_peers_report import print_table

    print_table(rows_for(3))
    out = capsys.readouterr().out
    assert "over windows: mean (min-max)" in out and "peak arrivals in 5 s per window" in out
    plot(rows_for(3), str(tmp_path / "w.png"))
    plot(rows_for(1, with_bound=False), str(tmp_path / "plain.png"))
    assert (tmp_path / "w.png").stat().st_size > 10_000 and (tmp_path / "plain.png").stat().st_size > 10_000


def test_the_peak_prefill_rate_is_the_fastest_size_on_the_served_model(monkeypatch):
    import torch

    import adaserve_backend.model_runner as model_runner
    import adaserve_backend.models as models
    import benchmarks.forward_latency as forward_latency

    loaded = []

    class Runner:
        max_len = 2048

        def __init__(self, model, cache):
            loaded.append((model, cache))

    monkeypatch.setattr(models, "load_model", lambda cfg: cfg)
    monkeypatch.setattr(model_runner, "ModelRunner", Runner)
    monkeypatch.setattr(forward_latency, "measure_prefill", lambda runner, n, repeats: {128: 100.0, 256: 128.0,
                                                                                         512: 400.0}[n])
    threads = torch.get_num_threads()
    rate = prefill_rate.measure_prefill_rate(repeats=1)
    assert rate.per_size == {128: 1280.0, 256: 2000.0, 512: 1280.0} and rate.tok_s == 2000.0
    (target, cache), = loaded
    assert target.path == "embedded:smollm2-135m-instruct" and rate.dtype == target.dtype  # as engine.json serves
    assert cache.block_size == 128 and torch.get_num_threads() == threads
    assert rate.to_dict()["per_size"] == {"128": 1280.0, "256": 2000.0, "512": 1280.0}
    given = prefill_rate.given_rate(1500.0)
    assert given.tok_s == 1500.0 and not given.measured and "given" in prefill_rate.describe(given)
    with pytest.raises(ValueError, match="positive"):
        prefill_rate.given_rate(0.0)


def test_a_run_goes_level_by_level_window_by_window_and_records_each(tmp_path, monkeypatch):
    """vs_peers.main with peers' servers faked: every system sees each level's windows in turn, each row has its
    window fields, the JSON its rate and windows, and no prompt goes twice to one server."""
    import json
    import sys

    from benchmarks import vs_peers
    from harness.metrics import RequestRecord

    sent: dict[str, list] = {}

    class Server:
        name, metrics_url = "fake", None

        def __init__(self, system):
            self.system = system

        def start(self):
            pass

        def stop(self):
            pass

    def run_system(system, server, items, args, slos):
        sent.setdefault(system, []).append(items)
        # the first half on time, the rest with a first token after its TTFT target
        records = [RequestRecord(it.request_id, it.category, it.tpot_slo_ms, it.arrival_s,
                                 first_token=it.arrival_s + (0.1 if i < len(items) // 2 else 10.0),
                                 last_token=it.arrival_s + 11.0, output_tokens=2000, ttft_slo_ms=it.ttft_slo_ms,
                                 finish_reason="stop") for i, it in enumerate(items)]
        return records, 30.0

    monkeypatch.setattr(vs_peers, "prompt_deck", lambda kind, seed: deck(seed=seed))
    monkeypatch.setattr(vs_peers, "embedded_tokenizer", WordTokenizer)
    monkeypatch.setattr(vs_peers, "make_server", lambda system, args, log_dir: Server(system))
    monkeypatch.setattr(vs_peers, "warm_up", lambda *a: None)
    monkeypatch.setattr(vs_peers, "wait_idle", lambda server: True)
    monkeypatch.setattr(vs_peers, "run_system", run_system)
    monkeypatch.setattr(vs_peers.signal, "signal", lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["vs_peers", "--rps", "1", "2", "--duration", "5", "--windows", "2",
                                      "--systems", "vllm", "llamacpp-bf16", "--prefill-rate", "5000",
                                      "--decode-rate", "500",
                                      "--out", str(tmp_path)])
    vs_peers.main()
    result = json.loads((tmp_path / "vs-peers.json").read_text())
    assert result["windows"] == 2 and result["repeat_share"] == 0.0
    assert result["prefill_rate"]["tok_s"] == 5000.0 and result["prefill_rate"]["measured"] is False
    assert result["decode_rate"]["tok_s"] == 500.0 and result["decode_rate"]["measured"] is False
    assert [(lv["rps"], lv["window"]) for lv in result["levels"]] == [(1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1)]
    rows = result["rows"]
    assert [(r["system"], r["rps"], r["window"]) for r in rows] == [
        (s, rps, w) for s in ("vllm", "llamacpp-bf16") for rps in (1.0, 2.0) for w in (0, 1)]
    for r in rows:
        assert r["bound"] == 1.0 and r["over_bound"] == r["slo_attainment"] and r["peak_5s"] >= 1
        assert r["bound_decode"] == 1.0 and r["over_bound_decode"] == r["slo_attainment"]
    assert sent["vllm"] == sent["llamacpp-bf16"]  # the same requests, in the same order, to every system
    prompts = [it.prompt for items in sent["vllm"] for it in items]
    assert len(prompts) == len(set(prompts)) == 5 + 5 + 10 + 10
    assert (tmp_path / "vs-peers.png").stat().st_size > 10_000
