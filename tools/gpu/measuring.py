"""How a measurement is taken: CUDA-event timings of single calls after warm-up (wall time on a CPU, where
the tests run the same code), host time of a plan up to the GPU's finishing it, the attention backends
under test by name, and the short error text a failed row keeps.

Everything is eager (no CUDA graphs yet), so launch overhead the GPU waits for counts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

BACKENDS = ("flashinfer", "sdpa")


def short(e: BaseException, limit: int = 600) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def empty_cache(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def cuda_ms(fn: Callable[[], object], warmup: int = 3, reps: int = 10, device="cuda") -> dict:
    """Median and minimum of `reps` CUDA-event timings of fn(), after `warmup` calls (wall time on a CPU,
    where the tests run this code)."""
    for _ in range(warmup):
        fn()
    sync(device)
    if torch.device(device).type != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return {"ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4)}
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events]
    return {"ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4)}


def host_ms(fn: Callable[[], object], reps: int = 3, device="cuda") -> float:
    """Median wall time of fn() up to the GPU's finishing it (planning: host work and copies)."""
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 4)


def make_attention(name: str, cache, heads: int):
    if name == "flashinfer":
        from adaserve_backend.attention.flashinfer_cuda import FlashInferBackend

        return FlashInferBackend(cache, heads)
    if name == "sdpa":
        from adaserve_backend.attention.torch_sdpa import TorchSDPABackend

        return TorchSDPABackend(cache, heads)
    raise ValueError(name)
