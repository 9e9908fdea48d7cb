"""Which machine a run measured: every dated number names its CPU, and on a CPU AMX or its absence
prices every step."""

from __future__ import annotations

from adaserve_backend.calibration_pool import machine


def cpu_model() -> str:
    """The CPU's model name, with or without AMX and AVX512-BF16 (from /proc/cpuinfo, as the engine
    names the machine its calibrations are pooled for)."""
    info = machine()
    if not info:
        return "unknown"
    flags = info.get("flags", "").split()
    return (f"{info.get('model name', 'unknown')} ({'with' if 'amx_tile' in flags else 'no'} AMX, "
            f"{'with' if 'avx512_bf16' in flags else 'no'} AVX512-BF16)")
