"""The `compile` step: FlashInfer's kernels for bf16 and fp16 compiled at once by two worker processes
(`python3 -m tools.gpu_check --compile-worker <dtype>`), each timed and stopped with its ninja and nvcc when
out of time. A dtype whose compile fails or runs out of time loads the prebuilt kernels carried in
.gpu/aot/ instead; what compiled is packed to come back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tools.gpu.env import ROOT, SITE, arch_tag, child_env, setup_env
from tools.gpu.kernels import DTYPES, install_carried_kernels, jit_libraries, pack_kernels

RESULT_TAG = "GPU_CHECK_RESULT "
WORKER = ["-m", "tools.gpu_check", "--compile-worker"]  # + the dtype: one compile worker


def warm_up(dtype_name: str) -> dict:
    """First plan and run of each kind of forward with FlashInferBackend, timed (the first compiles)."""
    import torch

    from adaserve_backend.attention.flashinfer_cuda import FlashInferBackend
    from tools.gpu_batches import build, qkv

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    out = {}
    for kind, requests in (("masked prefill", [("tree", 40, 16), ("prefill", 0, 30), ("decode", 20, 1)]),
                           ("causal prefill", [("prefill", 0, 30), ("decode", 20, 1)]),
                           ("decode", [("decode", 20, 1), ("decode", 70, 1)])):
        batch = build(requests, kv_heads=8, head_dim=128, dtype=dtype, device="cuda")
        q, k, v = qkv(batch.num_tokens, 32, 8, 128, dtype, "cuda")
        t = time.monotonic()
        backend = FlashInferBackend(batch.cache, 32)
        backend.plan(batch.meta)
        backend.forward(0, q, k, v)
        torch.cuda.synchronize()
        out[kind] = round(time.monotonic() - t, 2)
    return out


def compile_worker(dtype_name: str) -> None:
    """`--compile-worker bf16`: import flashinfer and warm every kind of forward up, print the timings."""
    setup_env()
    t = time.monotonic()
    import flashinfer  # noqa: F401

    result = {"dtype": dtype_name, "import_s": round(time.monotonic() - t, 1)}
    result["first_calls_s"] = warm_up(dtype_name)
    result["seconds"] = round(time.monotonic() - t, 1)
    print(RESULT_TAG + json.dumps(result), flush=True)


def compile_kernels(ctx) -> dict:
    """Both dtypes' kernels compiled at once by two worker processes, each timed. A dtype whose compile
    fails or runs out of time falls back to the prebuilt kernels carried in .gpu/aot/, if any."""
    if ctx.no_flashinfer:
        raise RuntimeError(f"not tried: flashinfer {ctx.no_flashinfer}")
    aot = SITE / "flashinfer" / "data" / "aot"
    out: dict = {"prebuilt_present": sorted(p.name for p in aot.iterdir()) if aot.is_dir() else []}
    limit = min(ctx.compile_timeout, max(60.0, ctx.left() - 150))
    out.update(run_workers(ctx, DTYPES, limit, "compile"))
    failed = [d for d in DTYPES if not out[d]["ok"]]
    if failed and not ctx.use_prebuilt and install_carried_kernels(arch_tag()):
        ctx.say(f"  compile failed for {', '.join(failed)}: loading the carried prebuilt kernels instead")
        retry = run_workers(ctx, failed, max(30.0, min(120.0, ctx.left() - 150)), "prebuilt")
        for d in failed:
            out[d] = {"ok": retry[d]["ok"], "source": "prebuilt (carried), after the compile failed",
                      "compile": out[d], "load": retry[d]}
    for d in DTYPES:
        out[d].setdefault("source", "prebuilt (carried)" if ctx.use_prebuilt else "compiled here")
    ctx.flashinfer_dtypes = [d for d in DTYPES if out[d]["ok"]]
    if not out["bf16"]["ok"]:
        ctx.no_flashinfer = "its kernels did not compile (see compile.bf16 in gpu-check.json)"
    try:
        out["packed"] = pack_kernels(jit_libraries(), ctx.run_dir, ctx.out, arch_tag())
    except Exception as e:
        out["packed_error"] = f"{type(e).__name__}: {e}"
    if not all(out[d]["ok"] for d in DTYPES):
        raise RuntimeError("no kernels for " + ", ".join(d for d in DTYPES if not out[d]["ok"]))
    return out


def run_workers(ctx, dtypes, limit: float, label: str) -> dict:
    """`--compile-worker` processes for `dtypes` at once, stopped (with their ninja and nvcc) after `limit` s."""
    env = child_env({"MAX_JOBS": os.environ.get("MAX_JOBS", str(max(1, (os.cpu_count() or 2) // len(dtypes))))})
    t0 = time.monotonic()
    procs = {}
    for name in dtypes:
        log = open(ctx.run_dir / f"{label}-{name}.log", "w")
        # a session of its own: a worker out of time is stopped with its ninja and nvcc processes
        procs[name] = (subprocess.Popen([sys.executable, *WORKER, name],
                                        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True), log)
    out: dict = {f"{label}_max_jobs_each": env["MAX_JOBS"], f"{label}_timeout_s": round(limit)}
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=max(1.0, limit - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        log.close()
        text = (ctx.run_dir / f"{label}-{name}.log").read_text(errors="replace")
        found = [line for line in text.splitlines() if line.startswith(RESULT_TAG)]
        if proc.returncode == 0 and found:
            out[name] = json.loads(found[-1][len(RESULT_TAG):]) | {"ok": True}
        else:
            out[name] = {"ok": False, "returncode": proc.returncode, "log_tail": text[-3000:]}
        out[name]["wall_s"] = round(time.monotonic() - t0, 1)
        ctx.say(f"  {label} {name}: {'ok' if out[name]['ok'] else 'FAILED'} after {out[name]['wall_s']} s")
    out[f"{label}_wall_s"] = round(time.monotonic() - t0, 1)
    return out
