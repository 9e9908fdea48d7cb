"""One command for a lent GPU machine (issue 72): `python3 -m tools.gpu_check`, or `make gpu-check`.

It runs with the machine's own python3 (the project's .venv is not usable there: another Python) and
needs from this checkout, besides the code, the wheels in .wheels/ (docs/gpu.md: which, and how to carry
them). Steps, in order, each guarded (a failure is recorded and the next step runs) and each skipped
when the time budget (--budget-s, 8 minutes by default) is spent:

1. env: device, driver, torch, CUDA, nvcc, ninja.
2. install: flashinfer-python and apache-tvm-ffi from .wheels/ into .gpu/site (pip --no-index --no-deps:
   everything else flashinfer imports is already on the machine).
3. compile: FlashInfer's kernels for bf16 and fp16 (they JIT-compile with nvcc on first use; the cache
   is .gpu/.cache), two processes at once, each timed; the built libraries are packed for carrying. A
   dtype whose compile fails or runs out of time loads the prebuilt kernels carried in .gpu/aot/ instead
   (`--prebuild` makes them on any machine with nvcc; `--use-prebuilt` loads them without compiling).
4. tests: pytest tests/gpu (FlashInfer and SDPA on CUDA against the torch reference) and the CPU tests
   of the plan inputs.
5. accuracy: the largest differences from the reference, FlashInfer and SDPA, bf16 and fp16.
6. attention: FlashInfer against SDPA per layer at Llama-3.1-8B's attention shape, trees/decodes/a mix.
7. layers: a few Llama-3.1-8B decoder layers (random bf16 weights), forward time per token budget,
   scaled to 32 layers, against issue 72's speed targets.

After every step it writes runs/gpu-check/<UTC date>/gpu-check.json and gpu-check.md (and copies them,
the test log and the packed kernels to $OUT when that is set), so whatever ends the run leaves what was
done. It imports only torch, this project's attention and kv_cache modules, and flashinfer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / ".gpu"  # ignored: installed wheels, the JIT cache, carried prebuilt kernels
SITE = GPU_DIR / "site"
AOT_CARRIED = GPU_DIR / "aot"
WHEELS = ROOT / ".wheels"
DTYPES = ("bf16", "fp16")
OUT_PART_BYTES = 15 * 2**20  # files back from the device tool: 16 MiB each at most
RESULT_TAG = "GPU_CHECK_RESULT "
WORKER = ["-m", "tools.gpu_check", "--compile-worker"]  # + the dtype: one compile worker


# ---- environment --------------------------------------------------------------------------------------

def setup_env(site: Path = SITE) -> None:
    """Where flashinfer and tvm-ffi cache what they compile, nvcc and ninja on PATH, .gpu/site importable.
    Must run before flashinfer is imported (it reads these at import)."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(GPU_DIR))  # -> .gpu/.cache/flashinfer/...
    os.environ.setdefault("TVM_FFI_CACHE_DIR", str(GPU_DIR / "tvm-ffi"))
    path = os.environ.get("PATH", "").split(os.pathsep)
    extra = [str(Path(sys.executable).parent)]
    try:
        import ninja

        extra.append(str(ninja.BIN_DIR))
    except Exception:
        pass
    if not os.environ.get("CUDA_HOME"):
        # flashinfer takes the toolkit from `which nvcc`'s parent folder, wrong for an nvcc that is a wrapper
        # script elsewhere: the first folder with CUDA's headers instead
        nvcc = shutil.which("nvcc")
        for home in ([str(Path(nvcc).resolve().parent.parent)] if nvcc else []) + ["/usr/local/cuda", "/opt/cuda"]:
            if Path(home, "include", "cuda_runtime.h").exists() and Path(home, "bin", "nvcc").exists():
                os.environ["CUDA_HOME"] = home
                extra.append(f"{home}/bin")
                break
    os.environ["PATH"] = os.pathsep.join([p for p in extra if p not in path] + path)
    if str(site) not in sys.path and site.exists():
        sys.path.insert(0, str(site))
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def command_line(cmd: list[str], timeout: float = 20) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (out.stdout or out.stderr).strip() or None
    except Exception:
        return None


def env_info(ctx) -> dict:
    import torch

    info = ctx.results["env"]
    info.update({"python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
                 "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                 "cpus": os.cpu_count(), "nvcc": None, "ninja": shutil.which("ninja"),
                 "cuda_home": os.environ.get("CUDA_HOME")})
    nvcc = command_line(["nvcc", "--version"])
    if nvcc:
        info["nvcc"] = nvcc.splitlines()[-1]
    smi = command_line(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                        "--format=csv,noheader"])
    if smi:
        info["nvidia_smi"] = smi
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1))
    else:
        raise RuntimeError("no CUDA device: torch.cuda.is_available() is False")
    return info


def arch_tag() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"sm{major}{minor}"


# ---- install ------------------------------------------------------------------------------------------

def wheel_version(name: str, wheels: list[Path]) -> str | None:
    for w in wheels:
        parts = w.name.split("-")
        if parts[0].lower().replace("_", "-") == name:
            return parts[1]
    return None


def install(ctx) -> dict:
    wheels = sorted(ctx.wheels.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheels in {ctx.wheels}: download them there and carry the folder (docs/gpu.md)")
    want = wheel_version("flashinfer-python", wheels)
    meta = SITE / "flashinfer" / "_build_meta.py"
    have = re.search(r'__version__ = "([^"]+)"', meta.read_text()).group(1) if meta.exists() else None
    out = {"wheels": [w.name for w in wheels]}
    if have is not None and have == want:
        out["pip"] = f"flashinfer {have} already in {SITE.relative_to(ROOT)}"
    else:
        t = time.monotonic()
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps",
               "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE)] + [str(w) for w in wheels]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"pip failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}")
        out["pip_s"] = round(time.monotonic() - t, 1)
    out["aot_carried"] = (AOT_CARRIED / f"flashinfer-aot-{arch_tag()}.tar.gz").is_file()
    out["aot_installed"] = install_carried_kernels(arch_tag()) if ctx.use_prebuilt else []
    setup_env()
    t = time.monotonic()
    import flashinfer  # noqa: F401  (first import: tvm-ffi may build its torch bridge)

    out["import_s"] = round(time.monotonic() - t, 1)
    out["flashinfer"] = flashinfer.__version__
    try:
        import tvm_ffi

        out["tvm_ffi"] = getattr(tvm_ffi, "__version__", None)
    except Exception:
        pass
    ctx.results["env"]["flashinfer"] = out["flashinfer"]
    return out


def install_carried_kernels(arch: str, carried: Path = AOT_CARRIED, site: Path = SITE) -> list[str]:
    """Prebuilt kernels carried as .gpu/aot/flashinfer-aot-<arch>.tar.gz (what `--prebuild` or an earlier
    run packed: <module>/<module>.so each) go where flashinfer looks for prebuilt ones, which it loads
    without building; only for this device's architecture."""
    tar_path = carried / f"flashinfer-aot-{arch}.tar.gz"
    dst = site / "flashinfer" / "data" / "aot"
    if not tar_path.is_file() or not (site / "flashinfer").is_dir():
        return []
    names = []
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) != 2 or parts[1] != f"{parts[0]}.so":
                continue  # only <module>/<module>.so, nothing that could land elsewhere
            (dst / parts[0]).mkdir(parents=True, exist_ok=True)
            (dst / parts[0] / parts[1]).write_bytes(tar.extractfile(member).read())
            names.append(parts[0])
    return sorted(names)


def prebuild(arch_list: str, head_dims: tuple[int, ...] = (128, 64)) -> dict:
    """`--prebuild 9.0a`: on any machine with nvcc (no GPU needed), build the kernels FlashInferBackend
    uses (FA2 batch prefill for bf16 and fp16, which tensor-core decode shares, at head_dim 128, Llama-3's,
    and 64, the embedded SmolLM2's; and the mask packing) for that architecture, packed as
    .gpu/aot/flashinfer-aot-<arch>.tar.gz to carry."""
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch_list
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(GPU_DIR / "prebuild"))
    setup_env()
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not any((home / d / "libcuda.so").exists() for d in ("lib64", "lib64/stubs")) and not shutil.which(
            "nvidia-smi"):
        # no driver here, and no stub: link against an empty libcuda.so.1; the GPU machine's driver provides it
        stub = GPU_DIR / "stub"
        stub.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-Wl,-soname,libcuda.so.1", "-o",
                        str(stub / "libcuda.so")], check=True)
        os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stub}"
    import torch
    from flashinfer.jit import gen_batch_prefill_module
    from flashinfer.jit.quantization import gen_quantization_module

    specs = [gen_quantization_module()] + [
        gen_batch_prefill_module("fa2", dt, dt, dt, torch.int32, d, d, 0, False, False, False)
        for d in head_dims for dt in (torch.bfloat16, torch.float16)]
    out: dict = {"arch_list": arch_list, "modules": {}}
    for spec in specs:
        t = time.monotonic()
        print(f"[prebuild] {spec.name} ...", flush=True)
        spec.build(verbose=False)
        out["modules"][spec.name] = round(time.monotonic() - t, 1)
        print(f"[prebuild] {spec.name}: {out['modules'][spec.name]} s", flush=True)
    AOT_CARRIED.mkdir(parents=True, exist_ok=True)
    arch = "sm" + re.sub(r"[^0-9]", "", arch_list.split()[0])
    out["packed"] = pack_kernels([spec.jit_library_path for spec in specs], AOT_CARRIED, None, arch)
    return out


# ---- compile ------------------------------------------------------------------------------------------

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


def jit_libraries() -> list[Path]:
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", GPU_DIR)) / ".cache" / "flashinfer"
    return sorted(base.glob("*/*/cached_ops/*/*.so"))


def pack_kernels(libs: list[Path], run_dir: Path, out_dir: Path | None, arch: str) -> dict:
    """The compiled libraries as <module>/<module>.so in one .tar.gz in the run folder, and in parts of at
    most 15 MiB in $OUT when that is set: unpacked into .gpu/aot/<arch>/ and carried, the next machine
    loads them instead of compiling (docs/gpu.md)."""
    if not libs:
        return {"libraries": 0}
    tar_path = run_dir / f"flashinfer-aot-{arch}.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for so in libs:
            tar.add(so, arcname=f"{so.parent.name}/{so.name}")
    size = tar_path.stat().st_size
    out = {"libraries": len(libs), "names": [so.parent.name for so in libs],
           "mb": round(sum(so.stat().st_size for so in libs) / 2**20, 1), "tar_mb": round(size / 2**20, 1),
           "tar": str(tar_path)}
    if out_dir is not None and size <= 3 * OUT_PART_BYTES:
        data = tar_path.read_bytes()
        parts = [data[i : i + OUT_PART_BYTES] for i in range(0, len(data), OUT_PART_BYTES)]
        for i, part in enumerate(parts):
            (out_dir / f"{tar_path.name}.{i:02d}").write_bytes(part)
        out["out_parts"] = len(parts)
    elif out_dir is not None:
        out["out_parts"] = 0
        out["out_note"] = "too large to bring back in at most 3 parts of 15 MiB"
    return out


# ---- tests --------------------------------------------------------------------------------------------

def run_tests(ctx) -> dict:
    xml = ctx.run_dir / "pytest.xml"
    log = ctx.run_dir / "gpu-tests.log"
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "tests/unit/test_flashinfer_plan.py", "-q", "-ra",
           "-p", "no:cacheprovider", "--confcutdir=tests/gpu", "-o", "addopts=", f"--junitxml={xml}"]
    extra = {"GPU_CHECK_NO_FLASHINFER": ctx.no_flashinfer} if ctx.no_flashinfer else {}
    if ctx.flashinfer_dtypes is not None:  # kernels that did not compile are not tried again there
        extra["GPU_CHECK_FLASHINFER_DTYPES"] = ",".join(ctx.flashinfer_dtypes) or "none"
    limit = max(30.0, min(300.0, ctx.left() - 150))
    t = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=child_env(extra), capture_output=True, text=True, timeout=limit)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        said = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        text, code = "".join(said) + f"\n(timed out after {limit:.0f} s)", None
    log.write_text(text)
    ctx.copy_out(log)
    out = {"returncode": code, "seconds": round(time.monotonic() - t, 1), "log": str(log.relative_to(ROOT))}
    out.update(junit_summary(xml) if xml.exists() else {"summary": text.strip().splitlines()[-1:] or None})
    if code != 0:
        raise RuntimeError(f"pytest exited {code}: {out.get('failed', '?')} failed, {out.get('errors', '?')} errors")
    return out


def junit_summary(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failures = []
    skips: dict[str, int] = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for tag in ("failure", "error"):
            for f in case.findall(tag):
                failures.append({"test": name, "kind": tag, "message": (f.get("message") or "")[:500]})
        for s in case.findall("skipped"):
            reason = (s.get("message") or "")[:200]
            skips[reason] = skips.get(reason, 0) + 1
    return {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
            "skip_reasons": skips, "failures": failures}


# ---- accuracy and measurements -------------------------------------------------------------------------

def accuracy(ctx) -> list:
    import random

    import torch

    from adaserve_backend.attention.flashinfer_plan import build_plan
    from adaserve_backend.attention.paged_reference import paged_attention
    from tools.gpu_batches import build, qkv, random_requests
    from tools.gpu_bench import make_attention, short

    rows: list = []
    ctx.results["accuracy"] = rows
    backends = ["sdpa"] if ctx.no_flashinfer else ["flashinfer", "sdpa"]
    batches = {"mixed": None, "decode": ("decode",), "chains": ("prefill", "decode")}
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for i, (label, kinds) in enumerate(batches.items()):
            rng = random.Random(i)
            requests = random_requests(rng, 8, max_context=2048, kinds=kinds or ("decode", "prefill", "tree", "beam"))
            if kinds is None:
                requests.append(("tree", 1500, 64))
            batch = build(requests, dtype=dtype, device="cuda", seed=i)
            q, k, v = qkv(batch.num_tokens, 32, 8, 128, dtype, "cuda", seed=i)
            for name in backends:
                compiled = DTYPES if ctx.flashinfer_dtypes is None else ctx.flashinfer_dtypes
                if name == "flashinfer" and dtype_name not in compiled:
                    continue  # its kernels did not compile: not tried again here
                row = {"dtype": dtype_name, "batch": label, "backend": name, "tokens": batch.num_tokens}
                rows.append(row)
                try:
                    attn = make_attention(name, batch.cache, 32)
                    attn.plan(batch.meta)
                    got = attn.forward(0, q, k, v).float()
                    want = paged_attention(build_plan(batch.meta), q, *batch.cache.layer(0)).float()
                    unrounded = paged_attention(build_plan(batch.meta), q.float(),
                                                *(t.float() for t in batch.cache.layer(0)))
                    row.update(max_abs_err=float((got - want).abs().max()),
                               max_abs_err_vs_unrounded=float((got - unrounded).abs().max()),
                               max_abs_ref=float(want.abs().max()))
                except Exception as e:
                    row["error"] = short(e)
    return rows


def attention(ctx) -> list:
    from tools.gpu_bench import attention_points, bench_attention

    rows: list = []
    ctx.results["attention"] = rows
    backends = ("sdpa",) if ctx.no_flashinfer else ("flashinfer", "sdpa")
    deadline = min(ctx.deadline - ctx.reserve_layers, time.monotonic() + 150)
    bench_attention(attention_points(ctx.quick), rows, deadline, backends, log=ctx.progress)
    return rows


def layers(ctx) -> dict:
    from tools.gpu_bench import bench_layers

    sink: dict = {}
    ctx.results["layers"] = sink
    backends = ("sdpa",) if ctx.no_flashinfer else ("flashinfer", "sdpa")
    bench_layers(ctx.layers, sink, ctx.deadline - 10, backends, quick=ctx.quick, log=ctx.progress)
    return sink


# ---- results ------------------------------------------------------------------------------------------

def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if x == 0 or abs(x) >= 1e4:
            return f"{x:.{digits + 1}g}"
        return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return lines + [""]


def render_markdown(r: dict) -> str:
    env = r.get("env", {})
    out = [f"# gpu-check {r.get('started', '')}", ""]
    out.append(f"{env.get('device', 'no device')} ({env.get('capability', '?')}, {env.get('sms', '?')} SMs, "
               f"{env.get('memory_gib', '?')} GiB); torch {env.get('torch', '?')}, CUDA {env.get('torch_cuda', '?')}, "
               f"flashinfer {env.get('flashinfer', '-')}, Python {env.get('python', '?')}; "
               f"nvcc: {env.get('nvcc', '-')}; driver: {env.get('nvidia_smi', '-')}. "
               f"Wall time {fmt(r.get('wall_s'))} s.")
    out.append("")
    out.append("## Steps")
    out.append("")
    steps = r.get("steps", {})
    out += table(["step", "status", "seconds", "note"],
                 [[name, "ok" if s.get("ok") else ("skipped" if s.get("skipped") else "FAILED"), s.get("seconds"),
                   (s.get("skipped") or s.get("error") or "").replace("|", "/").replace("\n", " ")[:300]]
                  for name, s in steps.items()])
    c = r.get("compile")
    if c:
        out.append("## Compile (first use of FlashInfer's kernels, per dtype, both at once)")
        out.append("")
        rows = []
        for d in DTYPES:
            x = c.get(d, {})
            first = x.get("compile", x)  # after a fallback: the failed compile's figures
            calls = first.get("first_calls_s", {})
            rows.append([d, x.get("ok"), x.get("source"), first.get("seconds"), first.get("import_s"),
                         calls.get("masked prefill"), calls.get("causal prefill"), calls.get("decode"),
                         first.get("wall_s")])
        out += table(["dtype", "ok", "kernels", "worker s", "import s", "1st masked prefill s", "1st causal s",
                      "1st decode s", "done at s"], rows)
        if c.get("prebuilt_present"):
            out.append("Prebuilt kernels were in flashinfer's prebuilt folder (loaded, not compiled): "
                       + ", ".join(c["prebuilt_present"]) + ".")
            out.append("")
        p = c.get("packed", {})
        if p:
            out.append(f"Compiled libraries: {p.get('libraries')} ({fmt(p.get('mb'))} MB, packed "
                       f"{fmt(p.get('tar_mb'))} MB, {p.get('out_parts', 0)} parts in $OUT).")
            out.append("")
    t = r.get("tests")
    if t:
        out.append("## Tests")
        out.append("")
        out.append(f"{t.get('passed', '?')} passed, {t.get('failed', '?')} failed, {t.get('errors', '?')} errors, "
                   f"{t.get('skipped', '?')} skipped in {fmt(t.get('seconds'))} s (log: {t.get('log', '-')}).")
        out.append("")
        for f in t.get("failures", []):
            out.append(f"- {f['kind']}: `{f['test']}`: {f['message'][:300]}")
        for reason, n in t.get("skip_reasons", {}).items():
            out.append(f"- skipped {n}: {reason}")
        out.append("")
    a = r.get("accuracy")
    if a:
        out.append("## Accuracy against the reference (max abs difference from the float32 reference over the "
                   "same inputs, its output rounded to the dtype, and unrounded)")
        out.append("")
        out += table(["dtype", "batch", "backend", "tokens", "max abs err", "vs unrounded", "max abs ref", "error"],
                     [[x.get("dtype"), x.get("batch"), x.get("backend"), x.get("tokens"), x.get("max_abs_err"),
                       x.get("max_abs_err_vs_unrounded"), x.get("max_abs_ref"), x.get("error")] for x in a])
    att = r.get("attention")
    if att:
        out.append("## Attention per layer (bf16; 32 query heads, 8 KV heads, head_dim 128, pages of 16)")
        out.append("")
        out += table(["batch", "tokens", "KV MB", "FlashInfer ms", "kernel", "SDPA ms", "SDPA / FI", "FI plan ms",
                      "SDPA plan ms", "FI KV GB/s", "note"],
                     [[x.get("name"), x.get("tokens"), x.get("kv_mb"), x.get("flashinfer_ms"),
                       x.get("flashinfer_kernel"), x.get("sdpa_ms"), x.get("speedup"), x.get("flashinfer_plan_ms"),
                       x.get("sdpa_plan_ms"),
                       x.get("flashinfer_gb_s"),
                       x.get("skipped") or x.get("error") or x.get("flashinfer_error") or x.get("sdpa_error")]
                      for x in att])
    lay = r.get("layers")
    if lay:
        m = lay.get("measured", {})
        out.append(f"## Decoder layers ({lay.get('layers')} Llama-3.1-8B layers, random bf16 weights, "
                   f"{fmt(lay.get('layer_weight_mb'))} MB each; times scaled to {lay.get('scaled_to')} layers "
                   "+ output head + plan; eager)")
        out.append("")
        out.append(f"Measured: copy {fmt(m.get('copy_tb_s'))} TB/s, bf16 matmul {fmt(m.get('bf16_matmul_tflops'))} "
                   f"TFLOP/s; sheet: {fmt((lay.get('spec_hbm_bytes_s') or 0) / 1e12 or None)} TB/s, "
                   f"{fmt((lay.get('spec_bf16_flops') or 0) / 1e12 or None)} TFLOP/s.")
        out.append("")
        out += table(["point", "tokens", "backend", "ms/layer", "est. forward ms", "tokens/s", "plan ms",
                      "head ms", "HBM TB/s", "of sheet", "TFLOP/s", "of sheet", "note"],
                     [[x.get("name"), x.get("tokens"), x.get("backend"), x.get("layer_ms"), x.get("est_forward_ms"),
                       x.get("tokens_per_s"), x.get("plan_ms"), x.get("lm_head_ms"), x.get("hbm_tb_s"),
                       x.get("hbm_fraction"), x.get("tflops"), x.get("flops_fraction"),
                       x.get("skipped") or x.get("error")] for x in lay.get("points", [])])
        tg = lay.get("targets")
        if tg:
            out.append("### Issue 72's targets (eager, no CUDA graphs yet)")
            out.append("")
            keys = ["b1_decode_ms", "b1_decode_ok", "b1_decode_hbm_fraction", "b1_tree64_over_decode", "b1_tree64_ok",
                    "b16_tree64_over_decode", "b16_tree64_ok", "prefill2048_flops_fraction", "prefill2048_ok"]
            names = list(tg)
            out += table(["target"] + names, [[k] + [tg[n].get(k) for n in names] for k in keys])
    return "\n".join(out).rstrip() + "\n"


def write_results(results: dict, run_dir: Path, out: Path | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("gpu-check.json", json.dumps(results, indent=1, default=str)),
                       ("gpu-check.md", render_markdown(results))):
        tmp = run_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(run_dir / name)
        if out is not None:
            shutil.copy2(run_dir / name, out / name)


# ---- the run ------------------------------------------------------------------------------------------

class Context:
    def __init__(self, args) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.wheels = Path(args.wheels)
        self.quick, self.layers = args.quick, args.layers
        self.compile_timeout = args.compile_timeout
        self.use_prebuilt = args.use_prebuilt
        self.reserve_layers = 75.0  # what the layer step needs at least
        self.no_flashinfer: str | None = None
        self.flashinfer_dtypes: list[str] | None = None  # those whose kernels compiled (None: not known)
        day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        self.run_dir = Path(args.out) if args.out else ROOT / "runs" / "gpu-check" / day
        out = os.environ.get("OUT") if args.copy_to is None else args.copy_to
        self.out = Path(out) if out else None
        self.results: dict = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, message: str) -> None:
        print(f"[gpu-check +{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def save(self) -> None:
        self.results["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.results["wall_s"] = round(time.monotonic() - self.t0, 1)
        write_results(self.results, self.run_dir, self.out)

    def progress(self, message: str) -> None:
        """A measurement's line, and the results so far on disk (a run cut off keeps them)."""
        self.say(message)
        self.save()

    def copy_out(self, path: Path) -> None:
        if self.out is not None and path.exists():
            shutil.copy2(path, self.out / path.name)


STEPS = [  # (name, function, seconds it needs at least to be worth starting)
    ("env", env_info, 0),
    ("install", install, 20),
    ("compile", compile_kernels, 90),
    ("tests", run_tests, 40),
    ("accuracy", accuracy, 20),
    ("attention", attention, 30),
    ("layers", layers, 40),
]


def run_step(ctx: Context, name: str, fn, status: dict) -> None:
    ctx.say(f"{name} ...")
    t = time.monotonic()
    try:
        data = fn(ctx)
        if data is not None and name != "env":
            ctx.results[name] = data
        status["ok"] = True
    except Exception as e:
        status.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-3000:])
        if name == "install":
            ctx.no_flashinfer = f"it did not install: {type(e).__name__}: {e}"[:300]
    status["seconds"] = round(time.monotonic() - t, 1)
    ctx.say(f"{name}: {'ok' if status['ok'] else 'FAILED: ' + status['error'][:300]} ({status['seconds']} s)")


def keep_earlier(run_dir: Path) -> None:
    """A second run on the same day keeps the first one's files under their time."""
    old = run_dir / "gpu-check.json"
    if old.exists():
        stamp = datetime.datetime.fromtimestamp(old.stat().st_mtime, datetime.timezone.utc).strftime("%H%M%S")
        for name in ("gpu-check.json", "gpu-check.md"):
            if (run_dir / name).exists():
                (run_dir / name).rename(run_dir / name.replace("gpu-check", f"gpu-check-{stamp}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=480, help="start no step past this many seconds (default 480)")
    ap.add_argument("--compile-timeout", type=float, default=240, help="seconds the kernels may take to compile")
    ap.add_argument("--use-prebuilt", action="store_true",
                    help="load the kernels carried in .gpu/aot/ instead of compiling them (by default they are "
                         "only the fallback of a compile that fails or runs out of time)")
    ap.add_argument("--wheels", default=str(WHEELS), help="folder of the wheels to install (default .wheels)")
    ap.add_argument("--out", help="run folder (default runs/gpu-check/<UTC date>)")
    ap.add_argument("--copy-to", help="also copy the results here (default $OUT when set)")
    ap.add_argument("--skip", default="", help="steps to leave out, comma-separated: "
                    + ",".join(s for s, *_ in STEPS[1:]))
    ap.add_argument("--layers", type=int, default=4, help="decoder layers in the stack measured (default 4)")
    ap.add_argument("--quick", action="store_true", help="fewer measurement points (a second run)")
    ap.add_argument("--prebuild", metavar="ARCH", help="only build the kernels for ARCH (e.g. 9.0a) into .gpu/aot/, "
                    "on any machine with nvcc and flashinfer importable (docs/gpu.md)")
    ap.add_argument("--compile-worker", choices=DTYPES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_worker:
        compile_worker(args.compile_worker)
        return 0
    if args.prebuild:
        print(json.dumps(prebuild(args.prebuild), indent=1))
        return 0
    ctx = Context(args)
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - {s for s, *_ in STEPS[1:]}
    if unknown:
        ap.error(f"unknown steps: {', '.join(sorted(unknown))}")
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    keep_earlier(ctx.run_dir)
    if ctx.out is not None:
        ctx.out.mkdir(parents=True, exist_ok=True)
    setup_env()
    r = ctx.results
    r.update(schema=1, started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             argv=sys.argv[1:] if argv is None else argv, budget_s=args.budget_s, env={}, steps={})
    ctx.say(f"writing to {ctx.run_dir}" + (f" and {ctx.out}" if ctx.out else ""))
    for name, fn, needs in STEPS:
        status: dict = {}
        r["steps"][name] = status
        if name in skip:
            status["skipped"] = "--skip"
        elif name != "env" and not r["steps"]["env"].get("ok"):
            status["skipped"] = "no CUDA device"
        elif ctx.left() < needs:
            status["skipped"] = f"out of time ({max(0, ctx.left()):.0f} s left of {args.budget_s:.0f})"
        else:
            run_step(ctx, name, fn, status)
        if "skipped" in status:
            ctx.say(f"{name}: skipped ({status['skipped']})")
        ctx.save()
    ctx.say(f"done: {ctx.run_dir / 'gpu-check.md'}")
    print(render_markdown(r), flush=True)
    return 0 if all(s.get("ok") for s in r["steps"].values() if "skipped" not in s) else 1


if __name__ == "__main__":
    sys.exit(main())
