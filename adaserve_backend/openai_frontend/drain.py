"""The OpenAI frontend's drain: what it does between SIGTERM (or SIGINT) and its exit.

    signal -> draining: /health answers 503 and new generations 503 + Retry-After, while the listening
              socket stays open (a load balancer sees "not ready", not a refused connection)
           -> the generations in flight go on until they finish or `grace_s` runs out
           -> what is left ends with a final "the server is shutting down" (an SSE error event, or a
              503 before any output), and the backend is stopped (`make serve`: tritonserver, which
              then ends whatever the frontend's aborts have not)
           -> aiohttp's own shutdown: the socket closes, the handlers are waited for, the process exits.

A second signal ends the grace at once. Why our own runner rather than `web.run_app`: run_app stops
listening before anything else on a signal, so neither the 503s nor the grace could happen.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from ..config import DrainConfig
from ..serving.errors import SHUTTING_DOWN, ErrorKind
from .backends import BackendError, http_error

log = logging.getLogger("adaserve.openai")
T = TypeVar("T")

DEFAULT_GRACE_S = DrainConfig().grace_s  # the same default as tritonserver run on its own
CHECK_EVERY_S = 0.05  # how often a draining frontend looks whether its generations have all finished


class Drain:
    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        DrainConfig(grace_s)  # validated as engine.json's is
        self.grace_s = grace_s
        self.draining = False
        self._begun = asyncio.Event()
        self._over = asyncio.Event()  # the grace has run out: what is still in flight ends now

    @property
    def over(self) -> bool:
        return self._over.is_set()

    def signalled(self) -> None:
        """The first signal begins the drain; the next ends its grace."""
        if self.draining:
            log.info("signalled again: ending the generations in flight now")
            self._over.set()
        self.draining = True
        self._begun.set()

    def refuse_new(self) -> None:
        """OpenAIError 503 with Retry-After for a new generation while draining."""
        if self.draining:
            raise http_error(BackendError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE))

    async def guard(self, awaitable: Awaitable[T]) -> T:
        """`awaitable`'s result, or BackendError (UNAVAILABLE, shutting down) once the grace runs out
        first. Raced only while draining (a task per call otherwise costs every token); an await that
        began before the drain is raced from the next one on."""
        if not self.draining:
            return await awaitable
        task = asyncio.ensure_future(awaitable)
        over = asyncio.ensure_future(self._over.wait())
        cut = False
        try:
            await asyncio.wait((task, over), return_when=asyncio.FIRST_COMPLETED)
        finally:
            over.cancel()
            if not task.done():  # the grace ran out, or this handler was cancelled (its client left)
                cut = True
                task.cancel()
                # until the backend's stream has closed (which aborts its request): closing it again
                # while it still runs would fail. Another cancellation (the request's other choices
                # ending it, choices.py) must not cut this wait short; it is passed on after.
                cancelled = False
                while not task.done():
                    try:
                        await asyncio.wait((task,))
                    except asyncio.CancelledError:
                        cancelled = True
                if cancelled:
                    raise asyncio.CancelledError
        if cut:
            raise BackendError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
        return task.result()

    async def wait_out(self, in_flight: Callable[[], int]) -> None:
        """Once signalled: until no generation is in flight or the grace runs out."""
        await self._begun.wait()
        n, deadline = in_flight(), time.monotonic() + self.grace_s
        log.info("stopping: %d generations in flight get up to %.1f s to finish", n, self.grace_s)
        while in_flight() and time.monotonic() < deadline and not self.over:
            await asyncio.sleep(CHECK_EVERY_S)
        if in_flight():
            log.info("the drain's grace ran out: ending %d generations", in_flight())
        self._over.set()


def serve(app: web.Application, host: str, port: int, drain: Drain, in_flight: Callable[[], int],
          on_stop: Callable[[], None] | None, **runner_kwargs) -> None:
    """Run `app` until SIGTERM/SIGINT, drain, call `on_stop` (stop the backend), then shut aiohttp down
    (`runner_kwargs`: AppRunner's and its request handlers' settings)."""
    asyncio.run(_serve(app, host, port, drain, in_flight, on_stop, runner_kwargs))


async def _serve(app: web.Application, host: str, port: int, drain: Drain, in_flight: Callable[[], int],
                 on_stop: Callable[[], None] | None, runner_kwargs: dict) -> None:
    runner = web.AppRunner(app, **runner_kwargs)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, drain.signalled)
        await drain.wait_out(in_flight)
    finally:  # cleanup stops listening, then waits for the handlers (each sending its final event)
        if on_stop is not None:
            on_stop()
        await runner.cleanup()
