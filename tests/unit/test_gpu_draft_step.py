"""The gpu-check's `draft` measurement (tools/gpu/draft_step_bench.py) without a GPU: a tiny draft head on
the CPU, eager through FlashInferBackend (on the flashinfer stand-in) and SDPA, and the graph path (the
graph-mode wrapper, its fixed buffers and plan) through a capture that reruns the step instead of
replaying a CUDA graph; the target judged, the markdown section, the step's glue."""

from __future__ import annotations

import argparse
import time

from tests.flashinfer_stand_in import install as stand_in_flashinfer
from tools.gpu import draft_head, draft_step_bench, runner, steps
from tools.gpu.draft_step_bench import DraftPoint, draft_points
from tools.gpu.report import render_markdown
from tools.gpu.targets import draft_targets

TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=300, layers=32, rope_theta=1e4)


def rerun_capture(fn):
    """A stand-in for a CUDA graph's capture: replay reruns fn into the first call's tensors."""
    out = fn()

    def replay():
        for static, fresh in zip(out, fn()):
            static.copy_(fresh)

    return replay, out


def tiny(monkeypatch):
    for module in (draft_step_bench, draft_head):
        monkeypatch.setattr(module, "SHAPE", TINY)
    monkeypatch.setattr(draft_head, "DRAFT_VOCAB", 50)


POINTS = [DraftPoint(1, 1, 40), DraftPoint(3, 1, 33), DraftPoint(1, 4, 40), DraftPoint(3, 4, 21)]


def test_the_draft_step_runs_eager_and_through_the_graph_path_on_the_cpu(monkeypatch):
    recorder = stand_in_flashinfer(monkeypatch)
    tiny(monkeypatch)
    sink: dict = {}
    draft_step_bench.bench_draft(sink, time.monotonic() + 600, log=lambda m: None, device="cpu", points=POINTS,
                                 capture=rerun_capture)
    rows = sink["points"]
    assert sink["graphs"] is True and sink["weight_mb"] > 0 and len(rows) == 4
    for r in rows:
        assert "error" not in r and "graph_error" not in r, r
        assert r["eager_ms"] > 0 and r["graph_ms"] > 0 and r["tokens"] == r["batch"] * r["width"]
        assert r["graph_ids_agree"] == 1.0 and r["graph_max_abs_diff"] == 0.0  # the stand-in is the reference
        assert isinstance(r["target_ok"], bool) and r["read_mb"] > 0
    assert [r["graph_kernel"] for r in rows] == ["decode", "decode", "prefill masked", "prefill masked"]
    inits = [kw for name, kw in recorder.calls if name.endswith(".init") and kw.get("use_cuda_graph")]
    assert len(inits) == 4
    masked = [kw for name, kw in recorder.calls if name == "prefill.plan" and kw.get("custom_mask") is not None]
    assert masked and all(kw.get("packed_custom_mask") is None for kw in masked)
    assert set(sink["targets"]) == {"context 21", "context 33", "context 40"}
    assert sum(t["points"] for t in sink["targets"].values()) == 4


def test_without_flashinfer_or_cuda_graphs_are_not_measured(monkeypatch):
    tiny(monkeypatch)
    sink: dict = {}
    draft_step_bench.bench_draft(sink, time.monotonic() + 600, backend="sdpa", log=lambda m: None, device="cpu",
                                 points=POINTS[1:3], no_graphs="flashinfer did not install")
    assert sink["graphs"] is False and sink["graphs_not_measured"] == "flashinfer did not install"
    assert all(r["eager_ms"] > 0 and "graph_ms" not in r and "error" not in r for r in sink["points"])
    assert sink["targets"] == {}
    sink = {}
    draft_step_bench.bench_draft(sink, time.monotonic() - 1, backend="sdpa", log=lambda m: None, device="cpu",
                                 points=POINTS[:1])
    assert sink["points"][0]["skipped"] == "out of time" and "CUDA device" not in sink["graphs_not_measured"]
    md = render_markdown({"steps": {"draft": {"ok": True}}, "draft": sink})
    assert "## Draft beam step" in md and "not measured" in md


def test_points_targets_and_the_markdown():
    pts = draft_points()
    assert {p.batch for p in pts} == {1, 4, 8, 16, 32} and {p.width for p in pts} == {1, 4}
    assert {p.context for p in pts} == {512, 2048} and len({p.name for p in pts}) == len(pts)
    assert len(draft_points(quick=True)) < len(pts) and pts[0].context == 512
    assert DraftPoint(2, 4, 512).requests == (("beam", 512, 4),) * 2
    assert DraftPoint(2, 1, 512).requests == (("decode", 512, 1),) * 2
    rows = [{"name": "b1 w1 @ 512", "context": 512, "batch": 1, "width": 1, "eager_ms": 1.2, "graph_ms": 0.2,
             "target_ok": True, "hbm_fraction": 0.8, "graph_kernel": "decode"},
            {"name": "b32 w4 @ 512", "context": 512, "batch": 32, "width": 4, "eager_ms": 1.5, "graph_ms": 0.31,
             "target_ok": False},
            {"name": "b1 w1 @ 2048", "context": 2048, "batch": 1, "width": 1, "eager_ms": 1.1},
            {"name": "b4 w1 @ 2048", "context": 2048, "error": "RuntimeError: boom"}]
    t = draft_targets(rows)
    assert t == {"context 512": {"points": 2, "met": 1, "worst_ms": 0.31, "worst_point": "b32 w4 @ 512",
                                 "ok": False}}
    md = render_markdown({"steps": {"draft": {"ok": True}},
                          "draft": {"backend": "flashinfer", "graphs": True, "weight_mb": 714.0, "target_ms": 0.25,
                                    "points": rows, "targets": t}})
    for text in ("## Draft beam step", "| b1 w1 @ 512 | 1 | 1 | 512 |", "RuntimeError: boom", "| context 512 |",
                 "b32 w4 @ 512", "| NO |"):
        assert text in md, text


def test_the_step_glue_picks_sdpa_and_says_why_without_flashinfer(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(draft_step_bench, "bench_draft", lambda sink, deadline, **kw: calls.append((deadline, kw)))
    ctx = runner.Context(argparse.Namespace(budget_s=480, wheels="w", quick=True, layers=1, compile_timeout=1,
                                            use_prebuilt=False, out=str(tmp_path), copy_to=None))
    ctx.no_flashinfer = "it did not install: ImportError"
    sink = steps.draft(ctx)
    (deadline, kw), = calls
    assert ctx.results["draft"] is sink and kw["backend"] == "sdpa" and "did not install" in kw["no_graphs"]
    assert kw["quick"] is True and deadline <= time.monotonic() + 60 and deadline < ctx.deadline
    assert [name for name, *_ in steps.STEPS].index("draft") > [name for name, *_ in steps.STEPS].index("layers")
