"""The C++ CPU kernel of csrc/paged_attention.cpp, compiled on first use by torch's extension builder
(g++ from the system; the build is cached under TORCH_EXTENSIONS_DIR, ~1 min the first time).

Where it cannot be built (no compiler, a non-x86 machine) `paged_attention_op` returns None after one
warning and the torch backend serves alone: slower under load, same results within bf16 rounding.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
# The kernel's loops are written for the compiler to vectorize; -march=native picks AVX-512 here.
CFLAGS = ["-O3", "-march=native", "-fopenmp"]


@functools.cache
def paged_attention_op():
    if os.environ.get("ADASERVE_NO_CPU_KERNEL"):
        return None
    try:
        from torch.utils.cpp_extension import load

        module = load(name="adaserve_paged_attention", sources=[str(SOURCE)], extra_cflags=CFLAGS,
                      extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: serve without the kernel
        log.warning("CPU paged-attention kernel unavailable, using torch SDPA for every sequence: %s", exc)
        return None
    return module.paged_attention
