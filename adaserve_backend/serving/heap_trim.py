"""Hands the C heap's free pages back to the system now and then (glibc's malloc_trim).

Why: a serving process allocates and frees tensors and Python objects of every size on several threads
(the engine's, the responses', the front end's), and glibc keeps what they freed in per-thread arenas
for reuse. Its resident memory therefore rises to each new peak of what was allocated at once (a burst
of long prompts, a large batch) and stays there, in steps, though nothing is held: the soak's memory
growth (docs/benchmarking.md#a-soak-make-soak). malloc_trim releases the free pages of every arena.

When: from the engine thread, at most every `interval_s`, so its cost (a walk over the free chunks,
milliseconds) is a small share of the steps. ctypes releases the GIL for the call. Elsewhere than glibc
(musl, macOS) there is no such call and this does nothing. ADASERVE_HEAP_TRIM_S sets the interval
(0: never), the A/B switch of the soak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

from ..config.environment import env_seconds

INTERVAL_ENV = "ADASERVE_HEAP_TRIM_S"
DEFAULT_INTERVAL_S = 10.0


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def interval_from_env(default: float = DEFAULT_INTERVAL_S) -> float:
    value = env_seconds(INTERVAL_ENV)
    if value is None:
        return default
    if not value >= 0:
        raise ValueError(f"${INTERVAL_ENV} must be >= 0 (0: never), got {value!r}")
    return value


class HeapTrimmer:
    def __init__(self, interval_s: float | None = None, clock=time.monotonic) -> None:
        self.interval_s = interval_from_env() if interval_s is None else interval_s
        self.clock = clock
        self._trim = _malloc_trim() if self.interval_s > 0 else None
        self._next = clock() + self.interval_s
        self.trims = 0  # how often it ran

    @property
    def active(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> None:
        """Trim if the interval has passed since the last trim."""
        if self._trim is None:
            return
        now = self.clock()
        if now < self._next:
            return
        self._trim(0)
        self.trims += 1
        self._next = self.clock() + self.interval_s
