"""The engine's inbox: requests and aborts come in from any thread and wait here until the engine loop
takes them at the start of its next step. It also knows which request ids are in flight (accepted and
not yet finished): a second request under a live id is refused at once, and an id may be used again
once its request's final output has been produced.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from .request import Request, RequestOutput
from .slo import SLO


class Inbox:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._live_ids: set[str] = set()  # accepted and not yet finished; guarded by _lock
        self._lock = threading.Lock()

    # ---- any thread -----------------------------------------------------------------------------
    def put_request(self, request: Request, slo: SLO) -> None:
        """Enqueue with its targets and the time it was received (ValueError for a live id)."""
        with self._lock:
            if request.request_id in self._live_ids:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            self._live_ids.add(request.request_id)
        self._queue.put((request, slo, time.monotonic()))

    def put_abort(self, request_id: str) -> None:
        self._queue.put((request_id, None, None))

    def empty(self) -> bool:
        return self._queue.empty()

    def queued(self) -> int:
        """Requests and aborts not yet taken by the engine loop."""
        return self._queue.qsize()

    # ---- the engine loop ------------------------------------------------------------------------
    def take(self) -> Iterator[tuple[Request | str, SLO | None, float | None]]:
        """What arrived so far, in order: (request, resolved SLO, received) or (aborted id, None, None)."""
        while not self._queue.empty():
            yield self._queue.get()

    def settle(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Finished request ids may be used again."""
        with self._lock:
            self._live_ids.difference_update(o.request_id for o in outputs if o.finished)
        return outputs
