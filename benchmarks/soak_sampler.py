"""The served stack from outside while the soak runs: resident memory of tritonserver's process tree
(the server and its Python backend stubs, where the models and their caches live) and of the OpenAI
frontend's, and Triton's KV and queue gauges on its metrics port; then, once the load has stopped,
the wait for those gauges to drain to zero."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.servers import gauge_sums, gauge_values, metrics_text

from .soak_records import ServerSample
from .soak_speed import machine_cpu, series_values

KV_USED = "adaserve_kv_blocks_used"  # adaserve_backend/triton/metrics.py: target KV blocks held by requests
BUSY = ("adaserve_running_requests", "adaserve_waiting_requests")
STUB = "triton_python_backend_stub"
MIB = 2**20


def process_label(proc: psutil.Process) -> str:
    """A Python backend stub by the model it serves (its first argument is the model's model.py), any
    other process by its name."""
    argv = proc.cmdline()
    if argv and STUB in argv[0]:
        model = Path(argv[1]).parts if len(argv) > 1 else ()
        return f"stub:{model[-3]}" if len(model) >= 3 and model[-1] == "model.py" else f"stub:{proc.pid}"
    return proc.name()


def tree(pid: int) -> list[psutil.Process] | None:
    """`pid` and every descendant, or None if `pid` is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None


def tree_rss(pid: int) -> tuple[float, dict[str, float]]:
    """(RSS in MiB of `pid` and every descendant, RSS per process by process_label). RSS counts pages
    shared between the processes once per process: a sum that only a real change in some process
    moves, which is what growth is read from."""
    if (procs := tree(pid)) is None:
        return 0.0, {}
    each: dict[str, float] = {}
    for proc in procs:
        try:
            label = process_label(proc)
            each[label] = each.get(label, 0.0) + proc.memory_info().rss / MIB
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sum(each.values()), each


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of `pid` and its live descendants so far."""
    if (procs := tree(pid)) is None:
        return None
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def sample(t0: float, triton_pid: int, frontend_pid: int, metrics_url: str) -> ServerSample:
    triton_mib, each = tree_rss(triton_pid)
    frontend_mib, _ = tree_rss(frontend_pid)
    text = metrics_text(metrics_url)  # one scrape for the gauges and the speed counters
    kv, running, waiting = gauge_sums(text, (KV_USED, *BUSY)) if text is not None else (None, None, None)
    counters = machine_cpu() | series_values(text or "")
    if (cpu := tree_cpu_s(triton_pid)) is not None:
        counters["triton_cpu_s"] = cpu
    return ServerSample(time.monotonic() - t0, triton_mib, each, frontend_mib, kv, running, waiting, counters)


@dataclass(frozen=True)
class Drain:
    """How the server emptied after the load: seconds until every gauge read 0 (None: not within the
    time allowed), and the last reading."""

    seconds: float | None
    kv_blocks_used: float | None
    running: float | None
    waiting: float | None

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "kv_blocks_used": self.kv_blocks_used, "running": self.running,
                "waiting": self.waiting}


def drain(metrics_url: str, timeout_s: float, poll_s: float = 1.0) -> Drain:
    """Wait until KV blocks in use, running and waiting requests all read 0; the gauges are published
    when the engine goes idle, so a server that freed everything shows it within a poll or two."""
    start = time.monotonic()
    values = None
    while True:
        values = gauge_values(metrics_url, (KV_USED, *BUSY)) or values
        if values is not None and not any(values):
            return Drain(time.monotonic() - start, *values)
        if time.monotonic() - start > timeout_s:
            return Drain(None, *(values if values is not None else (None, None, None)))
        time.sleep(poll_s)
