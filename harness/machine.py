"""Which machine a run measured: every dated number names its CPU, and on a CPU AMX or its absence
prices every step."""

from __future__ import annotations


def cpu_model() -> str:
    """The CPU's model name, with or without AMX and AVX512-BF16 (from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "unknown")
    return f"{name} ({'with' if 'amx_tile' in text else 'no'} AMX, {'with' if 'avx512_bf16' in text else 'no'} AVX512-BF16)"
