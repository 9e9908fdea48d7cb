"""The decoupled `adaserve` model's runtime: one engine-loop thread owns the models; `submit` (called
from Triton's execute) only validates and enqueues; a response thread (responses.py) does the sends, so the loop
never blocks on a client.

Every accepted request ends with exactly one FINAL response: its last data response, an error, or
CANCELLED. Cancellation (client cancel or dropped stream) is polled by a watcher thread, paced by
cancellation.py, and frees the request's KV blocks at once. Requests from the ensemble
pipeline (accept_ack) are not polled: the pipeline watches its client and aborts them by id.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from ..engine import Engine
from ..request import INTERNAL_ERROR, FinishReason, Overloaded, RequestOutput
from ..slo import BEST_EFFORT, attains, attains_ttft, tpot_seconds
from .cancellation import CancellationWatcher
from .coalesce import must_send, next_step_estimate
from .detokenize import Rendered, StreamState, text_delta
from .metrics import EngineMetrics, Finished
from .protocol import FRONT_INPUTS, INPUT_NAMES, TEXT_INPUTS, ResponseOptions, parse_request, response_tensors
from .repository import load_engine_config
from .responses import Responses
from .serving import SHUTTING_DOWN, ServingWatch

log = logging.getLogger("adaserve")

# finalize must return well within Triton's exit timeout (30 s): a step takes at most a few seconds on
# a CPU, and a send the backend no longer services must not hold the process.
SHUTDOWN_WAIT_S = 5.0
MAX_RESTARTS, RESTART_WINDOW_S = 3, 60.0
ENGINE_DEAD = "the engine is not running (it failed repeatedly; see the server's log)"


@dataclass
class Active:
    sender: object
    options: ResponseOptions
    slo_class: str
    prompt_ids: list[int]
    stream: StreamState = field(default_factory=StreamState)
    output_ids: list[int] = field(default_factory=list)
    held_since: float | None = None  # when the oldest token held back for coalescing was made
    last: RequestOutput | None = None  # the newest output, for a response of held tokens only
    watched: bool = True  # polled for cancellation (not: the ensemble pipeline aborts it by id)


class TritonEngineLoop:
    def __init__(self, pb, model_dir: str, engine: Engine | None = None, model_name: str = "adaserve") -> None:
        self.pb = pb
        self.serving = ServingWatch(pb, model_name)
        config = load_engine_config(model_dir)
        self._built, self._build_error, self._started = threading.Event(), None, threading.Event()
        self.loop_thread = threading.Thread(target=self._loop, args=(engine, config), name="adaserve-engine", daemon=True)
        self.loop_thread.start()
        self._built.wait()
        if self._build_error is not None:
            raise self._build_error
        self.tokenizer = self.engine.tokenizer
        classes = [c.name for c in config.scheduler.slo_classes] + ["custom", BEST_EFFORT]
        self.scheduler_config = config.scheduler  # resolves each request's SLO class for the metrics
        self.max_hold_ms = config.streaming.max_hold_ms
        self.next_step_s: float | None = None
        self.metrics = EngineMetrics(pb, classes)
        self.active: dict[str, Active] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.dead = False  # the loop failed too often (_supervise): refuse at once
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()
        self.responses = Responses(pb)
        # On its own thread: polling from the engine thread stalls the loop once per sweep, longer the more
        # requests are in flight (docs/experiments.md#cancel-thread).
        self.cancel_watch = CancellationWatcher(
            "adaserve-cancel-watch", self.lock, lambda: [i for i, a in self.active.items() if a.watched],
            lambda i: a.sender if (a := self.active.get(i)) is not None else None, self.engine.abort,
            lambda: self.stopping).start()
        self._started.set()

    # ---- called from Triton's execute -----------------------------------------------------------
    def submit(self, request) -> None:
        sender = request.get_response_sender()
        request_id = uuid.uuid4().hex
        try:
            tensors = {}
            for name in INPUT_NAMES + TEXT_INPUTS + FRONT_INPUTS:
                t = self.pb.get_input_tensor_by_name(request, name)
                if t is not None:
                    tensors[name] = t.as_numpy()
            if "abort_request_id" in tensors:
                self.engine.abort(_string(tensors["abort_request_id"]))
                self.responses.send(sender, None, final=True)
                self.wake.set()
                return
            if "request_id" in tensors:
                request_id = _string(tensors["request_id"])
            req, options = parse_request(request_id, tensors, self.tokenizer)
            slo_class = self.scheduler_config.resolve_slo(req.slo).slo_class
        except ValueError as e:
            self.responses.error(sender, str(e), self.pb.TritonError.INVALID_ARG)
            return
        with self.lock:  # registered before the engine can answer it
            if request_id in self.active:
                self.responses.error(sender, f"request id {request_id!r} is already in flight", self.pb.TritonError.INVALID_ARG)
                return
            self.active[request_id] = Active(sender, options, slo_class, req.prompt_ids, watched=not options.accept_ack)
        if options.accept_ack:  # queued before any answer
            self.responses.send(sender, self.pb.InferenceResponse(output_tensors=[]), final=False)  # see config.pbtxt
        try:
            if self.dead:
                raise Overloaded(ENGINE_DEAD)
            self.engine.check_room()
            self.engine.add_request(req)
        except (ValueError, Overloaded) as e:
            with self.lock:
                del self.active[request_id]
            code = self.pb.TritonError.INVALID_ARG if isinstance(e, ValueError) else self.pb.TritonError.UNAVAILABLE
            self.responses.error(sender, str(e), code)
            return
        self.wake.set()

    def shutdown(self) -> None:
        """Stop the loop after its current step; it ends every request with a final error response."""
        self.stopping = True
        self.wake.set()
        self.loop_thread.join(timeout=SHUTDOWN_WAIT_S)
        if self.loop_thread.is_alive():
            log.warning("the engine loop did not stop within %.0f s", SHUTDOWN_WAIT_S)
        self.cancel_watch.thread.join(timeout=1)
        self.responses.close(timeout=SHUTDOWN_WAIT_S)

    # ---- engine loop thread ---------------------------------------------------------------------
    def _loop(self, engine: Engine | None, config) -> None:
        # The engine is built on this thread, not on Triton's: once a thread has run oneDNN's GEMMs,
        # the same GEMMs run on any other thread take markedly longer (docs/experiments.md#engine-thread),
        # and the model's prepacking and load run oneDNN.
        try:
            self.engine = engine or Engine.from_config(config)
        except BaseException as e:  # initialize re-raises it: the model fails to load, loudly
            self._build_error = e
            return
        finally:
            self._built.set()
        self._started.wait()
        try:
            self._supervise()
        finally:  # on the loop thread: no step runs concurrently with fail_all
            for out in self.engine.fail_all(SHUTTING_DOWN):
                self._deliver(out)

    def _supervise(self) -> None:
        """Run steps until the model stops. A loop that dies past the per-step guard (a BaseException,
        a failure delivering outputs) fails what was in flight, freeing every block, and starts again;
        after MAX_RESTARTS within RESTART_WINDOW_S the engine counts as dead: requests are refused at
        once (UNAVAILABLE) instead of waiting for a loop that is gone."""
        deaths: list[float] = []
        while not self.stopping:
            try:
                self._run_steps()
            except BaseException:
                log.exception("the engine loop failed")
                now = time.monotonic()
                deaths = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
                self.dead = len(deaths) > MAX_RESTARTS  # before answering: whoever hears of the failure sees it
                try:
                    for out in self.engine.fail_all(INTERNAL_ERROR):
                        self._deliver(out)
                except BaseException:
                    log.exception("failing the in-flight requests failed")
                if self.dead:
                    self.metrics.engine_failed()
                    log.error("the engine loop failed %d times within %.0f s: refusing requests", len(deaths), RESTART_WINDOW_S)
                    return

    def _run_steps(self) -> None:
        while not self.stopping:
            if not self.engine.has_work():
                try:  # freed blocks and an empty batch show without waiting for another step
                    self.metrics.publish(self.engine, time.monotonic())
                except Exception:  # a metrics failure never ends the loop
                    log.exception("publishing metrics failed")
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            if self.serving.stopping():  # see serving.py: finalize would only come after the exit timeout
                self.stopping = True
                return
            before, started = self.engine.decode_iterations, time.monotonic()
            try:
                outputs = self.engine.step()
            except Exception:  # keep serving: fail what was in flight, free every block
                log.exception("engine step failed")
                outputs = self.engine.fail_all(INTERNAL_ERROR)
            self.next_step_s = next_step_estimate(self.next_step_s, time.monotonic() - started)
            for out in outputs:
                self._deliver(out)
            if self.max_hold_ms:
                self._send_due(time.monotonic())
            try:
                iteration = self.engine.iteration_stats[-1] if self.engine.decode_iterations > before else None
                now = time.monotonic()
                self.metrics.on_step(self.engine, sum(len(o.new_token_ids) for o in outputs), iteration, now)
            except Exception:
                log.exception("metrics failed")

    def _deliver(self, out: RequestOutput) -> None:
        with self.lock:
            a = self.active.get(out.request_id)
            if a is None:
                return
            if out.finished:
                del self.active[out.request_id]
        if out.finish_reason == FinishReason.ABORT:
            self.responses.error(a.sender, "request cancelled", self.pb.TritonError.CANCELLED)
            return
        if out.finish_reason == FinishReason.ERROR:
            code = self.pb.TritonError.UNAVAILABLE if out.error == SHUTTING_DOWN else self.pb.TritonError.INTERNAL
            self.responses.error(a.sender, out.error or "request failed", code)
            return
        if out.finished:
            try:
                self._record(a, out)
            except Exception:
                log.exception("recording metrics failed")
        if out.finish_reason == FinishReason.REJECTED:  # never after a data response (the scheduler's promise)
            self.responses.error(a.sender, out.error or "rejected", self.pb.TritonError.UNAVAILABLE)
            return
        if a.options.stream:
            if self._holds(a, out):
                a.stream.hold(out.new_token_ids)
                a.held_since, a.last = a.held_since or out.emit_time, out
                return
            rendered = a.stream.push(self.tokenizer, out.new_token_ids, final=out.finished)
            if rendered is None:
                return
            a.held_since = None
        else:
            a.output_ids.extend(out.new_token_ids)
            if not out.finished:
                return
            ids = a.output_ids if a.options.exclude_input_in_output else a.prompt_ids + a.output_ids
            rendered = Rendered([], ids, text_delta(self.tokenizer, [], ids))
        self._send(a, out, rendered)

    def _send(self, a: Active, out: RequestOutput, rendered: Rendered) -> None:
        tensors = response_tensors(out, a.options, rendered, self.clock_offset_ns)
        response = self.pb.InferenceResponse(output_tensors=[self.pb.Tensor(k, v) for k, v in tensors.items()])
        self.responses.send(a.sender, response, final=out.finished)

    def _holds(self, a: Active, out: RequestOutput) -> bool:
        """Coalescing (StreamingConfig.max_hold_ms): never the first visible token nor the last."""
        if not self.max_hold_ms or out.finished or not a.stream.rendered:
            return False
        return not self._due(a.held_since or out.emit_time, time.monotonic())

    def _due(self, held_since: float, now: float) -> bool:
        return must_send(held_since, now, self.next_step_s or 0.0, self.max_hold_ms / 1e3)

    def _send_due(self, now: float) -> None:
        """Held tokens whose hold would run out before the next step ends leave now, output or not."""
        with self.lock:
            held = [a for a in self.active.values() if a.held_since is not None]
        for a in held:
            if self._due(a.held_since, now):
                rendered = a.stream.push(self.tokenizer, [], final=False)
                if rendered is not None:
                    a.held_since = None
                    self._send(a, a.last, rendered)

    def _record(self, a: Active, out: RequestOutput) -> None:
        rejected = out.finish_reason == FinishReason.REJECTED
        first = out.first_token_time or out.emit_time
        ttft = None if rejected else first - out.arrival_time
        tpot = tpot_seconds(first, out.emit_time, out.num_output_tokens)
        self.metrics.on_finish(Finished(
            a.slo_class, out.num_prompt_tokens, out.num_output_tokens, ttft, tpot, out.emit_time - out.arrival_time,
            out.stats.queue_wait_s, attains_ttft(ttft, out.slo.ttft_ms), not rejected and attains(tpot, out.slo.tpot_ms),
            rejected, out.stats.overload, out.stats.predicted_ttft_s,
        ))


def _string(arr) -> str:
    value = arr.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
