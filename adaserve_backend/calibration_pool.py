"""The last few startup calibrations of one machine, pooled.

One calibration picks the budget B at the knee of curves that bend with no knee on a CPU, so a few
percent of timing noise moves B by 4-8 tokens from one start of the same server to the next, and with
it a lone request's depth (docs/scheduling.md#the-cost-model-and-its-calibration). Every start still measures (that also
runs each forward shape once before serving); the rooflines are then fitted to the per-size medians of
this start's curves and the previous ones of the same machine, which steadies B without moving it.

"The same machine" is everything the forwards' times depend on: the CPU's model and flags, the threads,
the device, both models' shapes and dtypes, the KV block size, and the CPU kernels' code (a kernel made
faster would otherwise be priced at the median of the slower starts before it until they aged out).
The record lives under ADASERVE_CACHE_DIR (default ~/.cache/adaserve)/calibration, one JSON file per
machine, newest last; where it cannot be written this start's calibration is used alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from pathlib import Path

from .cpu_extension import kernels_digest
from .models.gguf_cache import adaserve_cache, locked

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what a calibration measures changes
Curve = dict[int, float]  # tokens in the forward -> ms


def machine() -> dict:
    """The CPU as the kernel names it: model and flags (AMX, AVX-512 and the like decide which kernels run)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features", "CPU part") and key not in info:
                    info[key] = value.strip()
    except OSError:
        pass
    return info


def key_of(parts: dict) -> str:
    return hashlib.sha1(json.dumps([FORMAT, parts], sort_keys=True, default=str).encode()).hexdigest()[:16]


def engine_parts(config, target_spec, draft_spec, threads: int, kernel_choice=None) -> dict:
    """What an engine's calibration times depend on (`config`: its EngineConfig; the specs: the models'
    shapes, which say what was loaded where a config's path does not; `kernel_choice`: which kernel
    serves which products, models/kernel_choice.py)."""
    chosen = None if kernel_choice is None else [kernel_choice.plan, kernel_choice.pair_rows]
    return {"machine": machine(), "threads": threads, "target": _plain(config.target), "draft": _plain(config.draft),
            "target_spec": _plain(target_spec), "draft_spec": _plain(draft_spec),
            "block_size": config.target_cache.block_size, "kernels": kernels_digest(), "kernel_choice": chosen}


def _plain(value):
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else None if value is None else repr(value)


def pooled(parts: dict, verify: Curve, steps: Curve, keep: int, root: Path | None = None) -> tuple[Curve, Curve]:
    """Add this calibration to the machine's record (its `keep` newest kept) and return the per-size
    medians of verification and draft-step times over them, at the sizes every one of them measured."""
    if keep <= 1:
        return verify, steps
    directory = (root or adaserve_cache()) / "calibration"
    path = directory / f"{key_of(parts)}.json"
    try:
        with locked(directory):
            runs = json.loads(path.read_text())["runs"] if path.exists() else []
            runs = (runs + [{"at": time.time(), "verify": verify, "draft": steps}])[-keep:]
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps({"format": FORMAT, "parts": parts, "runs": runs}))
            os.replace(partial, path)
    except (OSError, ValueError, KeyError) as e:
        log.warning("cannot pool this calibration with the machine's earlier ones (%s); using it alone", e)
        return verify, steps
    log.info("calibration: the median of this start's and %d earlier of this machine (%s)", len(runs) - 1, path)
    return _medians([r["verify"] for r in runs]), _medians([r["draft"] for r in runs])


def _medians(curves: list[dict]) -> Curve:
    """JSON keys are strings: sizes come back as ints."""
    curves = [{int(n): float(ms) for n, ms in c.items()} for c in curves]
    sizes = sorted(set.intersection(*(set(c) for c in curves)))
    return {n: statistics.median(c[n] for c in curves) for n in sizes}
