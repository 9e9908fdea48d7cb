"""tools/gpu/engine_bench.py on the CPU: the same code the check's `engine` step runs on the GPU, here tiny
(a short prompt, a few tokens, one run, one batch of two) through its command line, every row filled;
the step's skip without the embedded model; its section of the markdown report."""

from __future__ import annotations

import json
import time
import types

import pytest

from tools.gpu import engine_bench, model_parts
from tools.gpu.report import render_markdown


@pytest.mark.slow
def test_the_engine_measurement_runs_through_on_the_cpu(capsys):
    args = ["--device", "cpu", "--prompt-tokens", "12", "--output-tokens", "5", "--runs", "1", "--batches", "2"]
    assert engine_bench.main(args) == 0
    got = json.loads(capsys.readouterr().out)
    rows = got["rows"]
    assert [(r["policy"], r["requests"]) for r in rows] == [("adaserve", 1), ("adaserve", 2), ("continuous", 1),
                                                           ("continuous", 2)]
    for r in rows:
        assert "error" not in r and "skipped" not in r, r
        assert r["tokens"] == 5 * r["requests"] and r["tpot_ms"] > 0 and r["ttft_ms"] > 0 and r["tokens_per_s"] > 0
        assert r["backend"] == "auto" and r["cuda_graphs"] is False and r["load_s"] >= 0
    assert rows[0]["same_tokens_as_first_engine"] == 5 and "same_tokens_as_first_engine" in rows[2]
    assert rows[2]["accepted_per_step"] == 1.0  # plain decode: one token a step
    assert got["settings"]["device"] == "cpu" and got["settings"]["batches"] == [2]
    md = render_markdown({"engine": got})
    assert "## The engine end to end" in md and "| auto | adaserve | 2 |" in md


@pytest.mark.slow
def test_nothing_starts_past_the_deadline():
    sink: dict = {}
    bench = engine_bench.EngineBench(device="cpu", backends=("auto",), prompt_tokens=8, output_tokens=2, runs=1)
    engine_bench.bench_engine(bench, sink, time.monotonic() - 1, log=lambda m: None)
    assert [r.get("skipped") for r in sink["rows"]] == ["out of time"] * 2


def test_the_step_is_skipped_with_its_reason_without_the_embedded_model(monkeypatch):
    monkeypatch.setattr(model_parts, "embedded_model_missing", lambda: "the embedded SmolLM2 cannot be read here")
    said = []
    ctx = types.SimpleNamespace(results={}, say=said.append)
    got = engine_bench.engine_step(ctx)
    assert ctx.results["engine"] is got and got["skipped"].startswith("the embedded SmolLM2 cannot be read here")
    assert "docs/gpu.md" in got["skipped"] and said
    assert "Skipped: the embedded SmolLM2" in render_markdown({"engine": got})


def test_the_cpu_takes_the_engines_own_attention():
    with pytest.raises(SystemExit):
        engine_bench.main(["--device", "cpu", "--backends", "sdpa"])
