"""Client cancellation for the models that hold requests across `execute` calls (the scheduler model
and the BLS pipeline): one watcher thread per model polls its live requests' senders and cancels those
whose client went away.

Why polled: the Python backend has no callback for cancellation. Why paced: each is_cancelled() is a
round trip to the server process that wakes a thread on the cores the engine's OpenMP threads use, so a
sweep is paced to at most CHECKS_PER_S checks a second, between every POLL_S (few requests) and every
POLL_MAX_S (a cancelled request keeps its KV blocks at most this much longer). Unpaced, the round trips
grow with the requests in flight, i.e. with the load (docs/triton.md#cancellation).
Why one sender at a time under the model's lock: once a request's final response is sent, Triton frees
its sender's response factory and is_cancelled() on it crashes the server; a sender is asked only while
the model still lists it, and never the whole sweep under the lock, which every response takes too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("adaserve")

POLL_S = 0.1
POLL_MAX_S = 1.0
CHECKS_PER_S = 40


def sweep_interval(active: int) -> float:
    """Seconds until the next sweep over `active` requests."""
    return min(POLL_MAX_S, max(POLL_S, active / CHECKS_PER_S))


class CancellationWatcher:
    """candidates(): the request ids to ask about now; sender_of(id): its sender while the model still
    holds it (asked under `lock`); cancel(id): what the model does for a cancelled one; stopped(): end
    the thread; before_sweep(): the model's own periodic work, True to skip this sweep."""

    def __init__(self, name: str, lock: threading.Lock, candidates: Callable[[], Iterable[str]],
                 sender_of: Callable[[str], object | None], cancel: Callable[[str], None], stopped: Callable[[], bool],
                 before_sweep: Callable[[], bool] = lambda: False) -> None:
        self.lock, self.candidates, self.sender_of, self.cancel = lock, candidates, sender_of, cancel
        self.stopped, self.before_sweep = stopped, before_sweep
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> CancellationWatcher:
        self.thread.start()
        return self

    def _run(self) -> None:
        next_sweep = 0.0
        while not self.stopped():
            time.sleep(POLL_S)
            try:
                if self.before_sweep() or time.monotonic() < next_sweep:
                    continue
                next_sweep = time.monotonic() + sweep_interval(self.sweep())
            except Exception:  # never ends the watcher
                log.exception("cancellation polling failed")

    def sweep(self) -> int:
        """Cancels the candidates whose client cancelled; returns how many it asked about."""
        with self.lock:
            ids = list(self.candidates())
        for request_id in ids:
            with self.lock:
                if self.stopped():
                    return len(ids)
                sender = self.sender_of(request_id)
                cancelled = sender is not None and sender.is_cancelled()
            if cancelled:
                self.cancel(request_id)
        return len(ids)
