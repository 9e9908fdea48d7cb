"""One engine driven on one thread of its own: the driver behind the Triton scheduler model and every
Ray Serve replica. Requests are added from any thread; the thread steps while there is work, hands
every output to the front end (`EngineHooks.deliver`) and sleeps on `wake` otherwise.

Failures, one rule for both front ends: a step that raises fails what was in flight (every block
freed) and the thread steps on; so does a loop that dies past that guard (a BaseException, a failing
delivery), which is started again. Each counts as a failure, and after MAX_FAILURES within
FAILURE_WINDOW_S the engine is dead: requests are refused at once (UNAVAILABLE, ENGINE_DEAD) rather
than waiting on a loop that keeps failing. When the thread ends (stopped, dead, or the server stops)
every request still in flight gets a final error.

Why the engine is built on this thread: once one thread has run oneDNN's GEMMs, the same GEMMs on
another thread take markedly longer (docs/architecture.md#processes-and-threads), and loading and prepacking
the model run oneDNN.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..engine import Engine
from ..request import INTERNAL_ERROR, Overloaded, Request, RequestOutput
from ..scheduler.plan import IterationStats
from .errors import ENGINE_DEAD, SHUTTING_DOWN
from .heap_trim import HeapTrimmer

log = logging.getLogger("adaserve")

MAX_FAILURES, FAILURE_WINDOW_S = 3, 60.0
IDLE_WAIT_S = 0.05  # how often an idle thread looks again without being woken (hooks.idle runs each time)


@dataclass(frozen=True)
class Step:
    """One step as the front end sees it, after its outputs were delivered."""

    outputs: list[RequestOutput]
    seconds: float  # wall time of engine.step()
    iteration: IterationStats | None  # the step's decode iteration, if it ran one


class EngineHooks:
    """What a front end does around the steps. Every method runs on the engine thread; a failing
    `idle` or `stepped` is logged and never ends the loop."""

    def deliver(self, out: RequestOutput) -> None:
        raise NotImplementedError

    def idle(self) -> None:
        """Nothing to step (metrics of an emptied engine, load reports)."""

    def stepped(self, step: Step) -> None:
        """After a step's outputs were delivered."""

    def died(self) -> None:
        """The engine counts as dead from now on (called before its in-flight requests hear of it)."""

    def server_stopping(self) -> bool:
        """Asked before each step: True ends the thread as a stop() would."""
        return False


def deliver_all(hooks: EngineHooks, outputs: list[RequestOutput]) -> None:
    """Hand every output over, then raise the first delivery's failure, if any (the loop counts it as
    before). Why all first: the engine has settled these outputs, so one left undelivered is never
    made again; a final one lost left its front end's per-request state, and its client, waiting."""
    failure: BaseException | None = None
    for out in outputs:
        try:
            hooks.deliver(out)
        except BaseException as e:
            failure = failure or e
    if failure is not None:
        raise failure


class EngineThread:
    def __init__(self, build: Callable[[], Engine], hooks: EngineHooks, name: str = "adaserve-engine") -> None:
        """Builds the engine on the new thread and returns once it is built (re-raising what the build
        raised); the thread steps only after start()."""
        self.hooks = hooks
        self.wake = threading.Event()
        self.stopping = False
        self.dead = False
        self.failures: list[float] = []
        self.engine: Engine | None = None
        self.heap = HeapTrimmer()  # the C heap's free pages back to the system, between steps (heap_trim.py)
        self._built, self._go = threading.Event(), threading.Event()
        self._build_error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(build,), name=name, daemon=True)
        self.thread.start()
        self._built.wait()
        if self._build_error is not None:
            raise self._build_error

    def start(self) -> EngineThread:
        self._go.set()
        return self

    # ---- from any thread -----------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Enqueue; ValueError for bad input, Overloaded when the engine cannot take it now."""
        if self.dead or self.stopping:
            raise Overloaded(ENGINE_DEAD if self.dead else SHUTTING_DOWN)
        self.engine.check_room()
        self.engine.add_request(request)
        self.wake.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self.wake.set()

    def stop(self, timeout_s: float) -> bool:
        """End the thread after its current step; True if it ended within `timeout_s`."""
        self.stopping = True
        self._go.set()
        self.wake.set()
        self.thread.join(timeout=timeout_s)
        return not self.thread.is_alive()

    # ---- the engine thread ---------------------------------------------------------------------
    def _main(self, build: Callable[[], Engine]) -> None:
        try:
            self.engine = build()
        except BaseException as e:  # the constructor re-raises it: the front end fails to load, loudly
            self._build_error = e
            return
        finally:
            self._built.set()
        self._go.wait()
        try:
            while not self.stopping and not self.dead:
                try:
                    self._run_steps()
                except BaseException:
                    log.exception("the engine loop failed")
                    self._failed()
        finally:  # on this thread: no step runs concurrently with fail_all
            deliver_all(self.hooks, self.engine.fail_all(ENGINE_DEAD if self.dead else SHUTTING_DOWN))

    def _run_steps(self) -> None:
        while not self.stopping and not self.dead:
            self._guarded(self.heap.maybe_trim)
            if not self.engine.has_work():
                self._guarded(self.hooks.idle)
                self.wake.wait(IDLE_WAIT_S)
                self.wake.clear()
                continue
            if self.hooks.server_stopping():
                self.stopping = True
                return
            before, started = self.engine.decode_iterations, time.monotonic()
            try:
                outputs = self.engine.step()
            except Exception:  # keep serving: fail what was in flight, free every block
                log.exception("engine step failed")
                self._failed()
                continue
            seconds = time.monotonic() - started
            deliver_all(self.hooks, outputs)
            iteration = self.engine.iteration_stats[-1] if self.engine.decode_iterations > before else None
            self._guarded(self.hooks.stepped, Step(outputs, seconds, iteration))

    def _failed(self) -> None:
        now = time.monotonic()
        self.failures = [t for t in self.failures if now - t < FAILURE_WINDOW_S] + [now]
        if len(self.failures) >= MAX_FAILURES:  # before answering: whoever hears of the failure sees it
            self.dead = True
            log.error("the engine failed %d times within %.0f s: refusing requests",
                      len(self.failures), FAILURE_WINDOW_S)
            self._guarded(self.hooks.died)
        try:
            deliver_all(self.hooks, self.engine.fail_all(INTERNAL_ERROR))
        except BaseException:
            log.exception("failing the in-flight requests failed")

    @staticmethod
    def _guarded(hook: Callable, *args) -> None:
        try:
            hook(*args)
        except Exception:
            log.exception("%s failed", getattr(hook, "__name__", "a hook"))
