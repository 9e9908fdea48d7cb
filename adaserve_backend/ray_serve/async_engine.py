"""One Engine on its engine thread (serving/engine_thread.py), requests from an asyncio loop: the
replica's side of the driver the Triton model uses too. `generate` adds a request and yields its
outputs; a consumer that stops early (a client gone, a cancelled call) aborts it, which frees its KV
blocks. A dead or stopping engine reports itself unhealthy to the router."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable

from ..engine import Engine
from ..replica_routing import ReplicaLoad, measure_load
from ..request import Request, RequestOutput
from ..serving.engine_thread import EngineHooks, EngineThread, Step

LOAD_EVERY_S = 0.05  # how often the loop re-measures what the router reads (a few estimator look-ups)
UNHEALTHY = ReplicaLoad(0, 0, 0, 0, healthy=False, at=0.0)


class AsyncEngine(EngineHooks):
    def __init__(self, build: Callable[[], Engine]) -> None:
        """`build` runs on the engine thread (see engine_thread.py for why)."""
        self.streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.lock = threading.Lock()
        self.driver = EngineThread(build, self)
        self.engine = self.driver.engine
        self._load: ReplicaLoad = measure_load(self.engine.scheduler, self.engine.num_waiting())
        self.driver.start()

    @property
    def dead(self) -> bool:
        return self.driver.dead

    @property
    def load(self) -> ReplicaLoad:
        """What the router reads: unhealthy once the engine is dead or stopping."""
        if self.driver.dead or self.driver.stopping:
            return UNHEALTHY
        return self._load

    async def generate(self, request: Request) -> AsyncIterator[RequestOutput]:
        """The request's outputs, the last one finished. ValueError for bad input, Overloaded when the
        engine cannot take it now; both before any output."""
        queue: asyncio.Queue = asyncio.Queue()
        with self.lock:
            if request.request_id in self.streams:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            self.streams[request.request_id] = (asyncio.get_running_loop(), queue)
        added = finished = False
        try:
            self.driver.add(request)
            added = True
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            with self.lock:
                self.streams.pop(request.request_id, None)
            if added and not finished:
                self.driver.abort(request.request_id)

    def stop(self) -> None:
        """End the loop after its current step; every request in flight gets an error."""
        self.driver.stop(timeout_s=10)

    # ---- on the engine thread (EngineHooks) -----------------------------------------------------
    def idle(self) -> None:
        self._measure()

    def stepped(self, step: Step) -> None:
        self._measure()

    def _measure(self) -> None:
        if time.time() - self._load.at >= LOAD_EVERY_S:
            self._load = measure_load(self.engine.scheduler, self.engine.num_waiting())

    def deliver(self, out: RequestOutput) -> None:
        with self.lock:
            stream = self.streams.get(out.request_id)
        if stream is not None:
            loop, queue = stream
            loop.call_soon_threadsafe(queue.put_nowait, out)
