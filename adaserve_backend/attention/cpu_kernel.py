"""The C++ CPU kernel of csrc/paged_attention.cpp (built by adaserve_backend/cpu_extension.py); None
where it cannot be built, and the torch backend serves alone."""

from __future__ import annotations

from pathlib import Path

from ..cpu_extension import load_extension

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"


def paged_attention_op():
    module = load_extension("adaserve_paged_attention", SOURCE)
    return None if module is None else module.paged_attention
