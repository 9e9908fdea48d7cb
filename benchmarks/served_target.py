"""The served target model loaded in process as the engine runs it, for the benchmarks that time its
forwards directly (the prefill and decode rates behind the bounds): engine.json's checkpoint, dtype, KV
cache and thread count, and the CPU kernels chosen on this machine at load (models/kernel_choice.py).
Without that choice a measurement times the default kernel instead of the one the server serves with,
and a bound computed from it describes another machine."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_served_target(measure: Callable[[object, object], T]) -> tuple[object, T]:
    """(EngineConfig, measure(EngineConfig, ModelRunner)) for the served target. The model lives only
    while `measure` runs: on return it is freed, before any server starts, and the threads and the kernel
    choice are as they were, so nothing measured here stays with the process."""
    import torch

    from adaserve_backend.config import EngineConfig
    from adaserve_backend.device import on_cpu
    from adaserve_backend.model_runner import ModelRunner
    from adaserve_backend.models import load_model
    from adaserve_backend.models.kernel_choice import apply as choose_kernels
    from adaserve_backend.models.linear import kernels
    from benchmarks.one_request import ENGINE_JSON

    cfg = EngineConfig.from_json(str(ENGINE_JSON))
    threads, ops = torch.get_num_threads(), kernels()
    before = ops.kernel_choice() if ops is not None else None
    if cfg.threads is not None:  # as the served engine runs (Engine sets the same)
        torch.set_num_threads(cfg.threads)
    try:
        model = load_model(cfg.target)
        if on_cpu(cfg.target.device):
            choose_kernels(model, cfg.kernels)
        result = measure(cfg, ModelRunner(model, cfg.target_cache))
    finally:
        model = None  # the weights and the KV cache go before any server starts
        gc.collect()
        torch.set_num_threads(threads)
        if before is not None:
            ops.set_kernel_choice(*before)
    return cfg, result
