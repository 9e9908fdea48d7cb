"""Where the check keeps things on the GPU machine, the environment it and its child processes run in, and
the `env` step: what the machine has (device, driver, torch, CUDA, nvcc, ninja)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_DIR = ROOT / ".gpu"  # ignored: installed wheels, the JIT cache, carried prebuilt kernels
SITE = GPU_DIR / "site"
AOT_CARRIED = GPU_DIR / "aot"
WHEELS = ROOT / ".wheels"


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
