"""tools/gpu_check.py and its steps in tools/gpu/ without a GPU: the JSON and markdown writers on made-up
results (whole, and cut off after a failing step), the pytest XML summary, the packing of compiled kernels
into parts the device tool brings back and their install on the next machine, the speed targets, the
measurement points, and a whole run on a machine without CUDA (every step after env skipped, both files
written, exit status 1)."""

from __future__ import annotations

import argparse
import json
import tarfile
import time

import pytest

from tests.flashinfer_stand_in import install as stand_in_flashinfer
from tools import gpu_check
from tools.gpu import attention_bench, decoder_stack, kernel_compile, kernels, layer_bench, runner
from tools.gpu.points import Point, attention_points, layer_points, logit_rows, same
from tools.gpu.pytest_run import junit_summary
from tools.gpu.report import render_markdown, write_results
from tools.gpu.targets import targets

FULL = {
    "schema": 1, "started": "2026-11-27T21:00:00+00:00", "wall_s": 401.5,
    "env": {"device": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132, "memory_gib": 79.1,
            "torch": "2.11.0+cu130", "torch_cuda": "13.0", "python": "3.12.3", "flashinfer": "0.6.18.post1",
            "nvcc": "Build cuda_13.0", "nvidia_smi": "NVIDIA H100 80GB HBM3, 580.159.04"},
    "steps": {"env": {"ok": True, "seconds": 1.0}, "install": {"ok": True, "seconds": 9.0},
              "compile": {"ok": True, "seconds": 120.0}, "tests": {"ok": False, "seconds": 50.0, "error": "x | y"},
              "accuracy": {"ok": True, "seconds": 9.0}, "attention": {"ok": True, "seconds": 60.0},
              "layers": {"skipped": "out of time (20 s left of 480)"}},
    "install": {"aot_installed": []},
    "compile": {"bf16": {"ok": True, "seconds": 100.2, "import_s": 2.0, "wall_s": 101.0, "source": "compiled here",
                         "first_calls_s": {"masked prefill": 97.0, "causal prefill": 0.1, "decode": 0.2}},
                "fp16": {"ok": False, "source": "prebuilt (carried), after the compile failed",
                         "compile": {"ok": False, "returncode": 1, "log_tail": "nvcc error", "wall_s": 110.0},
                         "load": {"ok": False}},
                "prebuilt_present": ["batch_prefill_with_kv_cache_dtype_q_bf16"],
                "packed": {"libraries": 2, "mb": 30.5, "tar_mb": 12.0, "out_parts": 1}},
    "tests": {"passed": 28, "failed": 1, "errors": 0, "skipped": 1, "seconds": 48.0, "log": "runs/x/gpu-tests.log",
              "failures": [{"test": "tests.gpu.test_flashinfer_cuda::test_gqa_groups[28-4]", "kind": "failure",
                            "message": "AssertionError: mismatch"}],
              "skip_reasons": {"this flashinfer keeps its packed mask under other names": 1},
              "reported": {"tests.gpu.test_engine_cuda::test_bf16": {"engine_bf16_TorchSDPABackend": "{'a': 1}"}}},
    "accuracy": [{"dtype": "bf16", "batch": "mixed", "backend": "flashinfer", "tokens": 300, "max_abs_err": 0.0078,
                  "max_abs_err_vs_unrounded": 0.009, "max_abs_ref": 1.9},
                 {"dtype": "fp16", "batch": "decode", "backend": "sdpa", "tokens": 8, "error": "RuntimeError: no"}],
    "attention": [{"name": "8 trees x 16 @ 512", "tokens": 128, "kv_mb": 16.5, "flashinfer_ms": 0.05,
                   "flashinfer_kernel": "prefill masked", "sdpa_ms": 0.4, "speedup": 8.0, "flashinfer_plan_ms": 0.3,
                   "sdpa_plan_ms": 2.0, "flashinfer_gb_s": 345.0},
                  {"name": "64 trees x 64 @ 4096", "skipped": "out of time"}],
    "layers": {"layers": 4, "scaled_to": 32, "layer_weight_mb": 416.0, "spec_hbm_bytes_s": 3.35e12,
               "spec_bf16_flops": 989e12, "measured": {"copy_tb_s": 2.9, "bf16_matmul_tflops": 760.0},
               "points": [{"name": "b1 decode", "tokens": 1, "backend": "flashinfer", "layer_ms": 0.2,
                           "est_forward_ms": 7.0, "tokens_per_s": 142, "plan_ms": 0.2, "lm_head_ms": 0.35,
                           "hbm_tb_s": 2.1, "hbm_fraction": 0.63, "tflops": 1.0, "flops_fraction": 0.001},
                          {"name": "b1 tree 64", "backend": "sdpa", "error": "RuntimeError: out of memory"}],
               "targets": {"flashinfer": {"b1_decode_ms": 7.0, "b1_decode_ok": False}}},
}


def test_the_markdown_holds_every_section_and_survives_missing_parts():
    md = render_markdown(FULL)
    for text in ("NVIDIA H100 80GB HBM3", "flashinfer 0.6.18.post1", "| tests | FAILED |", "| layers | skipped |",
                 "x / y", "## Compile", "| fp16 | NO | prebuilt (carried), after", "| 110 |", "loaded, not compiled",
                 "28 passed, 1 failed", "`tests.gpu.test_engine_cuda::test_bf16` reports engine_bf16_TorchSDPABackend",
                 "test_gqa_groups[28-4]", "## Accuracy", "RuntimeError: no", "| 8 trees x 16 @ 512 | 128 |",
                 "out of time", "## Decoder layers", "760", "| b1 decode | 1 | flashinfer | 0.2 | 7 |",
                 "out of memory", "| b1_decode_ok | NO |"):
        assert text in md, text
    cut = {"started": "t", "env": {"python": "3.12"}, "steps": {"env": {"ok": False, "error": "no CUDA device"}}}
    md = render_markdown(cut)
    assert "no device" in md and "| env | FAILED |" in md and "## Attention" not in md


def test_results_are_written_and_copied(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    write_results(FULL, run, out)
    for folder in (run, out):
        assert json.loads((folder / "gpu-check.json").read_text())["env"]["sms"] == 132
        assert (folder / "gpu-check.md").read_text().startswith("# gpu-check 2026-11-27")
    assert not list(run.glob(".*.tmp"))
    runner.keep_earlier(run)  # a second run the same day keeps the first one's files
    assert not (run / "gpu-check.json").exists() and len(list(run.glob("gpu-check-*.json"))) == 1


def test_the_pytest_xml_summary(tmp_path):
    xml = tmp_path / "p.xml"
    xml.write_text("""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1"
      failures="1" skipped="2" tests="6"><testcase classname="tests.gpu.t" name="a"/>
      <testcase classname="tests.gpu.t" name="b"><failure message="assert 1 == 2">long</failure></testcase>
      <testcase classname="tests.gpu.t" name="c"><error message="fixture broke"/></testcase>
      <testcase classname="tests.gpu.t" name="d"><skipped message="no CUDA"/></testcase>
      <testcase classname="tests.gpu.t" name="e"><skipped message="no CUDA"/></testcase>
      <testcase classname="tests.gpu.t" name="f"><properties><property name="agreement" value="{'x': 0.9}"/>
      </properties></testcase></testsuite></testsuites>""")
    s = junit_summary(xml)
    assert (s["passed"], s["failed"], s["errors"], s["skipped"]) == (2, 1, 1, 2)
    assert s["skip_reasons"] == {"no CUDA": 2}
    assert [f["test"] for f in s["failures"]] == ["tests.gpu.t::b", "tests.gpu.t::c"]
    assert s["reported"] == {"tests.gpu.t::f": {"agreement": "{'x': 0.9}"}}


def test_compiled_kernels_come_back_in_parts_and_install_on_the_next_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "OUT_PART_BYTES", 1000)
    cache = tmp_path / "base" / ".cache" / "flashinfer"  # where FLASHINFER_WORKSPACE_BASE puts its JIT cache
    libs = []
    for name in ("batch_prefill_bf16", "segment_packbits"):
        so = cache / "0.6.18" / "90a" / "cached_ops" / name / f"{name}.so"
        so.parent.mkdir(parents=True)
        so.write_bytes(bytes(range(256)) * 8 + name.encode())
        libs.append(so)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "base"))
    assert kernels.jit_libraries() == sorted(libs)
    out = tmp_path / "out"
    out.mkdir()
    packed = kernels.pack_kernels(libs, tmp_path, out, "sm90")
    parts = sorted(out.glob("flashinfer-aot-sm90.tar.gz.*"))
    assert packed["libraries"] == 2 and packed["out_parts"] == len(parts) >= 1
    # here: the parts joined into .gpu/aot/; there: unpacked where flashinfer loads prebuilt kernels
    carried = tmp_path / "aot"
    carried.mkdir()
    joined = carried / "flashinfer-aot-sm90.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    assert joined.read_bytes() == (tmp_path / "flashinfer-aot-sm90.tar.gz").read_bytes()
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    assert kernels.install_carried_kernels("sm90", carried, site) == ["batch_prefill_bf16", "segment_packbits"]
    assert (site / "flashinfer/data/aot/segment_packbits/segment_packbits.so").read_bytes() == libs[1].read_bytes()
    assert kernels.install_carried_kernels("sm100", carried, site) == []  # another architecture: not used
    only = tmp_path / "only"
    (only / "flashinfer").mkdir(parents=True)  # the engine step takes those of one head_dim alone
    assert kernels.install_carried_kernels("sm90", carried, only, only="prefill") == ["batch_prefill_bf16"]
    # the image's way in (docker/Dockerfile): the command line, into a given data/aot
    aot = tmp_path / "image" / "flashinfer" / "data" / "aot"
    assert kernels.main(["install", str(joined), "--aot-dir", str(aot)]) == 0
    assert sorted(p.name for p in aot.iterdir()) == ["batch_prefill_bf16", "segment_packbits"]
    stray = tmp_path / "stray.tar.gz"
    with tarfile.open(stray, "w:gz") as tar:
        tar.add(libs[1], arcname="../escape.so")
    with pytest.raises(SystemExit, match="no <module>/<module>.so"):
        kernels.main(["install", str(stray), "--aot-dir", str(aot)])


def test_a_run_without_cuda_records_why_and_skips_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "setup_env", lambda site=None: None)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    code = gpu_check.main(["--out", str(tmp_path / "run"), "--copy-to", str(tmp_path / "out")])
    assert code == 1
    r = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert r["steps"]["env"]["ok"] is False and "no CUDA device" in r["steps"]["env"]["error"]
    assert all(s == {"skipped": "no CUDA device"} for name, s in r["steps"].items() if name != "env")
    assert r["env"]["torch"] and (tmp_path / "run" / "gpu-check.md").exists()


def test_targets_and_points():
    pts = [{"name": "b1 decode", "backend": "flashinfer", "est_forward_ms": 6.0, "hbm_fraction": 0.8},
           {"name": "b1 tree 64", "backend": "flashinfer", "est_forward_ms": 6.6},
           {"name": "b16 decode", "backend": "sdpa", "est_forward_ms": 10.0},
           {"name": "b16 tree 64", "backend": "sdpa", "est_forward_ms": 20.0},
           {"name": "b1 prefill 2048", "backend": "sdpa", "est_forward_ms": 50.0, "flops_fraction": 0.7},
           {"name": "b1 decode", "backend": "sdpa", "error": "x"}]
    t = targets(pts)
    assert t["flashinfer"] == {"b1_decode_ms": 6.0, "b1_decode_ok": True, "b1_decode_hbm_fraction": 0.8,
                               "b1_tree64_over_decode": 1.1, "b1_tree64_ok": True}
    assert t["sdpa"] == {"b16_tree64_over_decode": 2.0, "b16_tree64_ok": False, "prefill2048_flops_fraction": 0.7,
                         "prefill2048_ok": True}
    layer = layer_points()
    names = [p.name for p in layer]
    assert len(set(names)) == len(names) and len({p.requests for p in layer}) == len(layer)
    curve = {sum(n for _, _, n in p.requests) for p in layer}
    assert {1, 64, 1024, 2048} <= curve
    assert logit_rows((("prefill", 0, 2048),)) == 1 and logit_rows((("tree", 5, 64),) * 2) == 128
    att = attention_points()
    assert {len(p.requests) for p in att} >= {8, 32, 64} and len(attention_points(quick=True)) < len(att)


TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=100, layers=32, rope_theta=1e4)


def test_the_measurements_run_through_on_the_cpu(monkeypatch):
    """The attention and layer measurements at a tiny shape on the CPU, FlashInfer through the stand-in:
    every row filled, nothing raised (CUDA events become wall time there)."""
    stand_in_flashinfer(monkeypatch)
    for module in (attention_bench, decoder_stack, layer_bench):  # each reads the shape when it runs
        monkeypatch.setattr(module, "SHAPE", TINY)
    later = time.monotonic() + 600
    rows: list = []
    points = [Point("trees", same("tree", 3, 5, 40)), Point("decodes", same("decode", 4, 1, 33)),
              Point("mix", (("prefill", 0, 20),) + same("tree", 2, 4, 17) + same("decode", 2, 1, 9))]
    attention_bench.bench_attention(points, rows, later, log=lambda m: None, device="cpu")
    assert [r.get("flashinfer_kernel") for r in rows] == ["prefill masked", "decode", "prefill masked"]
    assert all(r["flashinfer_ms"] > 0 and r["sdpa_ms"] > 0 and "speedup" in r and "error" not in r for r in rows)
    sink: dict = {}
    points = [Point("b1 decode", same("decode", 1, 1, 40)), Point("b1 tree 64", same("tree", 1, 8, 40)),
              Point("b1 prefill 2048", (("prefill", 0, 30),))]
    layer_bench.bench_layers(2, sink, later, log=lambda m: None, device="cpu", points=points)
    got = sink["points"]
    assert len(got) == 6 and all("error" not in r and r["est_forward_ms"] > 0 and r["tflops"] >= 0 for r in got)
    assert set(sink["targets"]) == {"flashinfer", "sdpa"} and "b1_tree64_over_decode" in sink["targets"]["sdpa"]
    layer_bench.bench_layers(2, {}, time.monotonic() - 1, log=lambda m: None, device="cpu", points=points[:1])


WORKER = """
import json, os, sys, time
dtype = sys.argv[1]
behaviour = os.environ["FAKE_WORKER_" + dtype.upper()]
if behaviour == "hang":
    time.sleep(60)
if behaviour == "fail":
    print("nvcc: error"); sys.exit(1)
print("GPU_CHECK_RESULT " + json.dumps({"dtype": dtype, "seconds": 0.1, "first_calls_s": {"decode": 0.1}}))
"""


def test_compile_workers_time_out_fail_and_fall_back_to_carried_kernels(tmp_path, monkeypatch):
    """Two workers at once: one compiles, one hangs past the limit (stopped with its session); the hung
    dtype then loads the carried prebuilt kernels; with nothing carried a failure stays a failure."""
    monkeypatch.setattr(kernel_compile, "WORKER", ["-c", WORKER])
    monkeypatch.setattr(kernel_compile, "arch_tag", lambda: "sm90")
    monkeypatch.setattr(kernel_compile, "jit_libraries", lambda: [])
    ctx = runner.Context(argparse.Namespace(
        budget_s=1000, wheels="w", quick=False, layers=1, compile_timeout=3, use_prebuilt=False,
        out=str(tmp_path), copy_to=None))
    ctx.say = lambda m: None
    monkeypatch.setenv("FAKE_WORKER_BF16", "ok")
    monkeypatch.setenv("FAKE_WORKER_FP16", "hang")
    installed = []

    def install(arch):
        installed.append(arch)
        monkeypatch.setenv("FAKE_WORKER_FP16", "ok")  # the prebuilt kernels load
        return ["batch_prefill_f16"]

    monkeypatch.setattr(kernel_compile, "install_carried_kernels", install)
    t = time.monotonic()
    out = kernel_compile.compile_kernels(ctx)
    assert time.monotonic() - t < 30 and installed == ["sm90"]
    assert out["bf16"]["ok"] and out["bf16"]["source"] == "compiled here" and out["bf16"]["first_calls_s"]
    assert out["fp16"]["ok"] and out["fp16"]["source"].startswith("prebuilt (carried)")
    assert out["fp16"]["compile"]["ok"] is False and out["fp16"]["compile"]["returncode"] == -9
    assert ctx.flashinfer_dtypes == ["bf16", "fp16"] and ctx.no_flashinfer is None

    monkeypatch.setattr(kernel_compile, "install_carried_kernels", lambda arch: [])
    monkeypatch.setenv("FAKE_WORKER_BF16", "fail")
    ctx.flashinfer_dtypes = None
    try:
        kernel_compile.compile_kernels(ctx)
        raise AssertionError("a failed compile with nothing to fall back to must fail the step")
    except RuntimeError as e:
        assert "no kernels for bf16" in str(e)
    assert ctx.flashinfer_dtypes == ["fp16"] and "did not compile" in ctx.no_flashinfer
    assert "nvcc: error" in (tmp_path / "compile-bf16.log").read_text()
