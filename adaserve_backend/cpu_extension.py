"""The project's C++ CPU kernels (attention/csrc, models/csrc), compiled on first use by torch's
extension builder (g++ from the system; cached under TORCH_EXTENSIONS_DIR, ~1 min the first time).

Where a kernel cannot be built (no compiler, a non-x86 machine) `load_extension` returns None after one
warning and the torch code it would replace serves alone: slower, same results within bf16 rounding.
ADASERVE_NO_CPU_KERNEL=1 turns every kernel off (the A/B switch of the benchmarks).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sysconfig
from pathlib import Path

log = logging.getLogger(__name__)

SHARED_HEADERS = Path(__file__).parent / "csrc"
# The kernels' loops are written for the compiler to vectorize; -march=native picks AVX-512 where the CPU has it.
CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def kernels_digest() -> str:
    """The CPU kernels' code hashed (every source and header under a csrc folder of the package), and
    whether ADASERVE_NO_CPU_KERNEL turns them off: beside the machine, what a forward's time depends on,
    so calibrations taken before a kernel changed are not pooled with those after (calibration_pool.py)."""
    digest = hashlib.sha1(b"off" if os.environ.get("ADASERVE_NO_CPU_KERNEL") else b"on")
    for path in sorted(p for p in Path(__file__).parent.glob("**/csrc/*") if p.is_file()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@functools.cache
def load_extension(name: str, source: Path):
    """The compiled module of `source`, or None. Its name carries a hash of the source, the shared headers
    and the headers beside it, so an edited kernel is rebuilt rather than read from a stale cache; and of
    what else enters the compiler's command (the source's folder, the Python and torch it builds against),
    so the serving stub (linked to the system's Python) and a checkout elsewhere each keep their own
    build instead of rebuilding the other's on every start."""
    if os.environ.get("ADASERVE_NO_CPU_KERNEL"):
        return None
    import torch

    digest = hashlib.sha1(source.read_bytes())
    digest.update(f"{source.resolve()}|{sysconfig.get_paths()['include']}|{torch.__version__}|{CFLAGS}".encode())
    for header in sorted([*SHARED_HEADERS.glob("*.h"), *source.parent.glob("*.h")]):  # shared, then the kernel's own
        digest.update(header.read_bytes())
    try:
        from torch.utils.cpp_extension import load

        return load(name=f"{name}_{digest.hexdigest()[:10]}", sources=[str(source)], extra_cflags=CFLAGS,
                    extra_ldflags=["-fopenmp"],
                    extra_include_paths=[str(SHARED_HEADERS), str(source.parent)], verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: serve without the kernel
        log.warning("CPU kernel %s unavailable, the torch path serves instead: %s", name, exc)
        return None
