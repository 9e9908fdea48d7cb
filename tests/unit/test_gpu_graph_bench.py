"""tools/gpu/graph_bench.py run tiny on the CPU: the engine's decode step timed eager and through the graph
path (replayed by cuda_graphs.capture.eager_capture over the FlashInfer stand-in), the per-layer and fixed costs
separated, and the targets judged. The GPU runs it at Llama-3.1-8B's shape in `make gpu-check`."""

from __future__ import annotations

import time

import torch

from adaserve_backend.cuda_graphs.capture import eager_capture
from tests.flashinfer_stand_in import install as stand_in_flashinfer
from tools.gpu.graph_bench import bench_graphs, random_llama_model, weight_bytes

TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256, layers=32, rope_theta=10000.0)


def test_the_random_model_has_the_shape_asked_for():
    model = random_llama_model(2, device="cpu", shape=TINY, max_len=128)
    assert len(model.layers) == 2 and model.spec.head_dim == 16 and model.lm_head.weight.shape == (256, 64)
    assert model.embed_tokens.weight.dtype == torch.bfloat16


def test_the_bench_runs_both_modes_and_judges_the_targets(monkeypatch):
    stand_in_flashinfer(monkeypatch)
    sink: dict = {}
    lines: list[str] = []
    bench_graphs(sink, time.monotonic() + 120, layers=2, batches=(1, 3), context=20, steps=5, device="cpu",
                 log=lines.append, shape=TINY, capture=eager_capture)
    assert "errors" not in sink, sink.get("errors")
    assert {(r["mode"], r["batch"]) for r in sink["points"]} == {("eager", 1), ("eager", 3), ("graph", 1), ("graph", 3)}
    assert all(abs(r["est_step_ms"] - (r["fixed_ms"] + 32 * r["layer_ms"])) < 0.01 for r in sink["points"])
    assert {"b1_decode_eager_ms", "b1_decode_graph_ms", "b1_decode_graph_ok"} <= set(sink["targets"])
    assert len(lines) == 8


def test_weight_bytes_at_the_8b_shape_are_its_16_gb():
    from tools.gpu.points import SHAPE

    assert 15.0e9 < weight_bytes(SHAPE) < 16.1e9  # 8.0 B parameters less the embedding, in bf16
