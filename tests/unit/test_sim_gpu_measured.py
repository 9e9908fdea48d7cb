"""The simulator's H100 preset against the first `make gpu-check` on an H100 (sim/gpu_check_h100.json): its
peaks are the measured ones, its efficiency the fit to the compute-bound forwards (the eager, launch-bound
ones left out), and the datasheet preset it replaced is kept as it was."""

from __future__ import annotations

import json

import pytest

from sim.gpu_cost import EFFICIENCY, forward_s
from sim.gpu_measured import (
    FIXTURE,
    compute_bound,
    fit_efficiency,
    fixture,
    launch_floor_ms,
    load,
    measured_gpu,
    predicted_ms,
)
from sim.hardware import A100, GPUS, H100, H100_SHEET, LLAMA_70B, Gpu, parse_hardware

CHECK = load(FIXTURE)
FIT_TOLERANCE = 0.05  # the fitted backend's compute-bound points; the two backends differ by 10% between themselves


def test_the_h100_preset_has_the_measured_peaks():
    assert measured_gpu(CHECK) == H100
    assert (H100.hbm_bytes_s, H100.flops_s) == (CHECK.copy_bytes_s, CHECK.matmul_flops_s)
    assert "H100" in CHECK.device and GPUS["h100"] is H100 and parse_hardware("h100x4") == (H100, 4)


@pytest.mark.parametrize("backend", ["flashinfer", "sdpa"])
def test_only_forwards_whose_flops_outlast_the_launch_floor_are_compute_bound(backend):
    """Up to 512 tokens per forward the eager check timed the host's launches (a served engine replays
    CUDA graphs): only the 2,048-token prefill and 16 x 64-token trees count."""
    bound = compute_bound(CHECK, backend)
    assert sorted(p.name for p in bound) == ["b1 prefill 2048", "b16 tree 64"]
    assert all(p.tokens <= 512 for p in CHECK.points if p.backend == backend and p not in bound)
    # the batch-1 decode, launch-bound: measured about twice what its weights and cache take
    gpu, e = measured_gpu(CHECK), EFFICIENCY[H100.name]
    decode = next(p for p in CHECK.points if p.backend == backend and p.name == "b1 decode")
    assert decode.layer_ms == launch_floor_ms(CHECK, backend)
    assert decode.forward_ms > 1.5 * predicted_ms(gpu, CHECK, decode, e)


def test_the_refit_reproduces_the_measured_compute_bound_forwards():
    gpu, fitted = measured_gpu(CHECK), compute_bound(CHECK)
    e = fit_efficiency(gpu, CHECK, fitted)
    for p in fitted:
        got = predicted_ms(gpu, CHECK, p, e)
        assert abs(got / p.forward_ms - 1) <= FIT_TOLERANCE, f"{p.name}: {got:.1f} ms vs measured {p.forward_ms} ms"
    # the datasheet preset priced the same forwards far slower than the H100 ran them
    for p in fitted:
        assert predicted_ms(H100_SHEET, CHECK, p, EFFICIENCY[H100_SHEET.name]) > 1.5 * p.forward_ms


def test_the_shipped_h100_efficiency_is_the_refit():
    assert fit_efficiency(measured_gpu(CHECK), CHECK, compute_bound(CHECK)) == pytest.approx(
        EFFICIENCY[H100.name], abs=0.005)


def test_the_datasheet_preset_and_a100_are_unchanged():
    assert H100_SHEET == Gpu("H100-SXM-80GB-sheet", 3.35e12, 989e12, 450e9, 80e9)
    assert A100 == Gpu("A100-SXM-80GB", 2.0e12, 312e12, 300e9, 80e9)
    assert EFFICIENCY[H100_SHEET.name] == EFFICIENCY[A100.name] == 0.34
    assert parse_hardware("h100sheetx4") == (H100_SHEET, 4) and GPUS["h100sheet"] is H100_SHEET


def test_logit_rows_only_lighten_the_head():
    full = forward_s(A100, LLAMA_70B, 4, 512, 8192, 512 * 1024, 0.34)
    assert forward_s(A100, LLAMA_70B, 4, 512, 8192, 512 * 1024, 0.34, logit_rows=512) == full
    last = forward_s(A100, LLAMA_70B, 4, 512, 8192, 512 * 1024, 0.34, logit_rows=1)
    head_flops = 2 * LLAMA_70B.head_params * 511
    assert full - last == pytest.approx(head_flops / (4 * A100.flops_s * 0.34))


def test_the_fixture_is_a_gpu_check_json_trimmed(tmp_path):
    """`--fixture` keeps what `load` reads of a full run; points the check skipped or failed are dropped."""
    with open(FIXTURE) as f:
        run = json.load(f)
    run["steps"] = {"layers": {"ok": True}}
    run["layers"]["points"] = run["layers"]["points"] + [{"name": "late", "backend": "sdpa", "requests": 1,
                                                          "tokens": 1, "context": 1, "skipped": "out of time"}]
    for p in run["layers"]["points"]:
        p["plan_ms"] = 1.0
    full = tmp_path / "gpu-check.json"
    full.write_text(json.dumps(run))
    trimmed = tmp_path / "fixture.json"
    trimmed.write_text(json.dumps(fixture(str(full))))
    assert load(str(trimmed)) == load(str(full)) == CHECK
    assert "steps" not in json.loads(trimmed.read_text())
