"""One Engine stepped on its own thread, requests from an asyncio loop: the replica's half of what
triton/engine_loop.py does for the Triton model, without Triton. `generate` adds a request and yields
its outputs; a consumer that stops early (a client gone, a cancelled call) aborts it, which frees its
KV blocks. A failing step fails what was in flight and the loop goes on; after MAX_FAILURES within
FAILURE_WINDOW_S the engine counts as dead: requests are refused and the replica reports unhealthy."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator

from ..engine import Engine
from ..request import INTERNAL_ERROR, Overloaded, Request, RequestOutput
from ..replica_routing import ReplicaLoad, measure_load

log = logging.getLogger("adaserve.ray")
MAX_FAILURES, FAILURE_WINDOW_S = 3, 60.0
LOAD_EVERY_S = 0.05  # how often the loop re-measures what the router reads (a few estimator look-ups)
ENGINE_DEAD = "the engine is not running (it failed repeatedly; see the replica's log)"
STOPPED = "the replica is shutting down"


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.lock, self.wake = threading.Lock(), threading.Event()
        self.stopping, self.dead = False, False
        self.failures: list[float] = []
        self.load: ReplicaLoad = measure_load(engine.scheduler, engine.num_waiting())
        self.thread = threading.Thread(target=self._run, name="adaserve-engine", daemon=True)
        self.thread.start()

    async def generate(self, request: Request) -> AsyncIterator[RequestOutput]:
        """The request's outputs, the last one finished. ValueError for bad input, Overloaded when the
        engine cannot take it now; both before any output."""
        if self.dead or self.stopping:
            raise Overloaded(ENGINE_DEAD if self.dead else STOPPED)
        self.engine.check_room()
        queue: asyncio.Queue = asyncio.Queue()
        with self.lock:
            if request.request_id in self.streams:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            self.streams[request.request_id] = (asyncio.get_running_loop(), queue)
        added = finished = False
        try:
            self.engine.add_request(request)
            added = True
            self.wake.set()
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            with self.lock:
                self.streams.pop(request.request_id, None)
            if added and not finished:
                self.engine.abort(request.request_id)
                self.wake.set()

    def stop(self) -> None:
        """End the loop after its current step; every request in flight gets an error."""
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while not self.stopping and not self.dead:
            if not self.engine.has_work():
                self._measure()
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # keep serving: fail what was in flight, free every block
                log.exception("engine step failed")
                outputs = self.engine.fail_all(INTERNAL_ERROR)
                now = time.monotonic()
                self.failures = [t for t in self.failures if now - t < FAILURE_WINDOW_S] + [now]
                self.dead = len(self.failures) >= MAX_FAILURES
                self._measure()  # unhealthy before anyone hears of the failure
            self._deliver(outputs)
            self._measure()
        self._measure()
        self._deliver(self.engine.fail_all(ENGINE_DEAD if self.dead else STOPPED))

    def _measure(self) -> None:
        """The load the router reads: unhealthy once the engine is dead or stopping."""
        if self.dead or self.stopping:
            self.load = ReplicaLoad(0, 0, 0, 0, healthy=False, at=time.time())
        elif time.time() - self.load.at >= LOAD_EVERY_S:
            self.load = measure_load(self.engine.scheduler, self.engine.num_waiting())

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        with self.lock:
            targets = [(self.streams.get(o.request_id), o) for o in outputs]
        for stream, out in targets:
            if stream is not None:
                loop, queue = stream
                loop.call_soon_threadsafe(queue.put_nowait, out)
