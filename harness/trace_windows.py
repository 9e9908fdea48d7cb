"""Real-trace arrival windows: n consecutive arrivals of a recorded LLM service, from a seeded random
start, rescaled in time to a target mean rate.

A window keeps the trace's shape (its bursts, its lulls) at the load a level asks for; several windows
per level (other seeds) show how much a result depends on which stretch of traffic it met, which one
Poisson draw hides. The Azure LLM inference traces (`<project>/../shared/traces`, or the folder
`ADASERVE_TRACES` names) are reached by name: `azure-code` (a coding copilot, 5-second bursts several
times its mean rate) and `azure-conv` (a conversation service); `azure:PATH` reads any file of the same
columns (TIMESTAMP,ContextTokens,GeneratedTokens). Only the timestamps are used: our prompts and outputs
are our own.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Sequence
from pathlib import Path

from .workload import TraceRow, read_azure_trace, rescale_trace

TRACES_ENV = "ADASERVE_TRACES"  # a folder holding the named traces' files, instead of the default
NAMED_TRACES = {"azure-code": "AzureLLMInferenceTrace_code.csv", "azure-conv": "AzureLLMInferenceTrace_conv.csv"}
PEAK_WINDOW_S = 5.0


class TraceMissing(FileNotFoundError):
    """A trace the run names is not on this machine."""


def traces_dir() -> Path:
    """Where the named traces live: $ADASERVE_TRACES, else `shared/traces` beside the checkout."""
    from adaserve_backend import PROJECT_ROOT

    return Path(os.environ.get(TRACES_ENV) or PROJECT_ROOT.parent / "shared" / "traces")


def is_trace(kind: str) -> bool:
    """Whether an arrivals kind (`--arrivals`) replays a trace."""
    return kind in NAMED_TRACES or kind.startswith("azure:")


def trace_path(kind: str) -> Path:
    """The file of `azure-code`, `azure-conv` or `azure:PATH`; TraceMissing if it is not there."""
    if kind in NAMED_TRACES:
        path = traces_dir() / NAMED_TRACES[kind]
    elif kind.startswith("azure:"):
        path = Path(kind.split(":", 1)[1])
    else:
        raise ValueError(f"{kind!r} names no trace: {', '.join(NAMED_TRACES)} or azure:PATH")
    if not path.is_file():
        hint = f" (set {TRACES_ENV} to the folder holding {NAMED_TRACES[kind]})" if kind in NAMED_TRACES else ""
        raise TraceMissing(f"arrivals {kind!r}: no trace file at {path}{hint}")
    return path


def load_trace(kind: str) -> tuple[TraceRow, ...]:
    """The trace's rows in time order, parsed once per file version (every level and window of a run
    reads the same file)."""
    path = trace_path(kind).resolve()
    stat = path.stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[TraceRow, ...]:
    # mtime and size are part of the key so that a file replaced in place is read again
    return tuple(read_azure_trace(path))


def trace_window(rows: Sequence[TraceRow], rps: float, n: int, seed: int) -> list[float]:
    """n consecutive arrivals from a start drawn with `seed`, time-scaled so that their mean rate is
    `rps` (n-1 gaps over the span), the first at 0. ValueError if the trace holds fewer than n."""
    if n < 1:
        return []
    if n > len(rows):
        raise ValueError(f"a window of {n} arrivals is longer than the trace ({len(rows)} arrivals): "
                         "a lower rate or a shorter --duration")
    start = random.Random(seed).randrange(len(rows) - n + 1)
    return rescale_trace(rows[start:start + n], rps, n)


def peak_arrivals(times: Sequence[float], window_s: float = PEAK_WINDOW_S) -> int:
    """The most arrivals within any `window_s` seconds (t <= arrival < t + window_s): a window's burst,
    which the mean rate hides."""
    ordered = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(ordered):
        while ordered[lo] <= t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
