"""The decoupled `adaserve` model's runtime: the engine thread (serving/engine_thread.py) owns the
models; `submit` (called from Triton's execute) only validates and enqueues; a send thread
(send_thread.py) does the sends, so the engine never blocks on a client. This module keeps what is
Triton's: parsing the tensors, rendering and coalescing responses, metrics.

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
from dataclasses import dataclass, field, replace

from ..engine import Engine
from ..request import FinishReason, Overloaded, RequestOutput
from ..serving.coalesce import must_send, next_step_estimate
from ..serving.detokenize import Rendered, StreamState, text_delta
from ..serving.engine_thread import EngineHooks, EngineThread, Step
from ..serving.errors import SHUTTING_DOWN, ErrorKind, output_error
from ..serving.pacing import StreamPace
from ..slo import BEST_EFFORT, attains, attains_ttft, tpot_seconds
from . import exit_watchdog
from .cancellation import CancellationWatcher
from .metrics import EngineMetrics, Finished
from .protocol import FRONT_INPUTS, INPUT_NAMES, TEXT_INPUTS, ResponseOptions, parse_request, response_tensors
from .repository import load_engine_config
from .send_thread import SendThread, reply
from .shutdown_probe import ShutdownProbe

log = logging.getLogger("adaserve")

# finalize must return well within Triton's exit timeout (30 s): a step takes at most a few seconds on
# a CPU, and a send the backend no longer services must not hold the process.
SHUTDOWN_WAIT_S = 5.0


@dataclass
class Active:
    sender: object
    options: ResponseOptions
    prompt_ids: list[int]
    stream: StreamState = field(default_factory=StreamState)
    output_ids: list[int] = field(default_factory=list)
    held_since: float | None = None  # when the oldest token held back for coalescing was made
    last_sent: float | None = None  # when its last response left (monotonic)
    last: RequestOutput | None = None  # the newest output, for a response of held tokens only
    watched: bool = True  # polled for cancellation (not: the ensemble pipeline aborts it by id)
    logprobs: list = field(default_factory=list)  # the made tokens' TokenLogprobs not sent yet, in order
    wants_logprobs: bool = False
    prompt_logprobs: list | None = None  # the prompt's, until a response carries them
    pace: StreamPace | None = None  # a paced stream's timing (StreamingConfig.pace), from its first output


class TritonEngineLoop(EngineHooks):
    def __init__(self, pb, model_dir: str, engine: Engine | None = None, model_name: str = "adaserve") -> None:
        self.pb = pb
        self.shutdown_probe = ShutdownProbe(pb, model_name)
        config = load_engine_config(model_dir)
        build = (lambda: engine) if engine is not None else (lambda: Engine.from_config(config))
        self.driver = EngineThread(build, self)
        self.engine = self.driver.engine
        self.tokenizer = self.engine.tokenizer
        classes = [c.name for c in config.scheduler.slo_classes] + ["custom", BEST_EFFORT]
        # a request that gave its targets as numbers equal to a class's is counted under that class
        self.class_of_targets = {(c.tpot_ms, c.ttft_ms): c.name for c in config.scheduler.slo_classes}
        self.max_hold_ms = config.streaming.max_hold_ms
        self.pace = config.streaming.pace
        self.drain_grace_s = config.drain.grace_s
        self.stop_seen_at: float | None = None  # when the server's stop was first seen (the grace counts from it)
        self.next_step_s: float | None = None
        self.metrics = EngineMetrics(pb, classes)
        self.active: dict[str, Active] = {}
        self.lock = threading.Lock()
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()
        self.responses = SendThread(pb)
        self.exit_watchdog_armed = False
        self.served = False  # a request has come (the model is initialized and served)
        # On its own thread: polling from the engine thread stalls the loop once per sweep, longer the more
        # requests are in flight (docs/architecture.md#processes-and-threads).
        self.cancel_watch = CancellationWatcher(
            "adaserve-cancel-watch", self.lock, lambda: [i for i, a in self.active.items() if a.watched],
            lambda i: a.sender if (a := self.active.get(i)) is not None else None, self.driver.abort,
            lambda: self.driver.stopping).start()
        self.driver.start()

    # ---- called from Triton's execute -----------------------------------------------------------
    def submit(self, request) -> None:
        self.served = True
        sender = request.get_response_sender()
        request_id = uuid.uuid4().hex
        try:
            tensors = {}
            for name in INPUT_NAMES + TEXT_INPUTS + FRONT_INPUTS:
                t = self.pb.get_input_tensor_by_name(request, name)
                if t is not None:
                    tensors[name] = t.as_numpy()
            if "abort_request_id" in tensors:
                self.driver.abort(_string(tensors["abort_request_id"]))
                self.responses.send(sender, None, final=True)
                return
            if self.stop_seen_at is not None:  # draining: Triton refuses new requests itself; so does this
                self.responses.error(sender, SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
                return
            if "request_id" in tensors:
                request_id = _string(tensors["request_id"])
            req, options = parse_request(request_id, tensors, self.tokenizer)
        except ValueError as e:
            self.responses.error(sender, str(e), ErrorKind.INVALID_ARG)
            return
        with self.lock:  # registered before the engine can answer it
            if request_id in self.active:
                self.responses.error(sender, f"request id {request_id!r} is already in flight", ErrorKind.INVALID_ARG)
                return
            self.active[request_id] = Active(sender, options, req.prompt_ids, watched=not options.accept_ack,
                                             wants_logprobs=req.logprobs is not None)
        if options.accept_ack:  # queued before any answer
            self.responses.send(sender, self.pb.InferenceResponse(output_tensors=[]), final=False)  # see config.pbtxt
        try:
            self.driver.add(req)  # resolves its SLO (the class it is counted under comes back on its outputs)
        except (ValueError, Overloaded) as e:
            with self.lock:
                del self.active[request_id]
            kind = ErrorKind.INVALID_ARG if isinstance(e, ValueError) else ErrorKind.UNAVAILABLE
            self.responses.error(sender, str(e), kind)

    def shutdown(self) -> None:
        """Stop the loop after its current step; it ends every request with a final error response."""
        if not self.driver.stop(timeout_s=SHUTDOWN_WAIT_S):
            log.warning("the engine loop did not stop within %.0f s", SHUTDOWN_WAIT_S)
        self.cancel_watch.thread.join(timeout=1)
        self.responses.close(timeout=SHUTDOWN_WAIT_S)

    # ---- on the engine thread (EngineHooks) -----------------------------------------------------
    def idle(self) -> None:
        self.metrics.publish(self.engine, time.monotonic())  # freed blocks and an empty batch show at once
        # Idle too: a client that holds open a stream whose request has ended keeps a stopping server
        # alive as well (exit_watchdog.py); with nothing in flight there is no grace to wait out. Only
        # once a request came: a BLS call while the model is still initializing crashes the server.
        if self.served and not self.exit_watchdog_armed and self.shutdown_probe.stopping():
            self._arm_exit_watchdog(0.0)

    def _arm_exit_watchdog(self, drain_grace_s: float) -> None:
        """Once the server itself stops (not only this model's unload): bounds the exit however the server
        was started, the grace and margin counted from the last check that saw it serving."""
        if self.shutdown_probe.server_stopped and not self.exit_watchdog_armed:
            self.exit_watchdog_armed = exit_watchdog.arm(
                exit_watchdog.kill_after_s(drain_grace_s, self.shutdown_probe.noticed_late_s()))

    def server_stopping(self) -> bool:
        """True once the server stops and the drain's grace has run out (config/drain.py). Until then
        the requests in flight go on: Triton refuses new ones from the first moment, and unloads this
        model as soon as the last one ends. See shutdown_probe.py: finalize would only come after the
        exit timeout."""
        if not self.shutdown_probe.stopping():
            return False
        now = time.monotonic()
        if self.stop_seen_at is None:
            self.stop_seen_at = now
            log.info("the server stops: %d requests in flight get %.1f s to finish", len(self.active),
                     self.drain_grace_s)
        self._arm_exit_watchdog(self.drain_grace_s)
        return now - self.stop_seen_at >= self.drain_grace_s

    def died(self) -> None:
        self.metrics.engine_failed()

    def stepped(self, step: Step) -> None:
        self.next_step_s = next_step_estimate(self.next_step_s, step.seconds)
        if self.max_hold_ms:
            self._send_due(time.monotonic())
        tokens = sum(len(o.new_token_ids) for o in step.outputs)
        self.metrics.on_step(self.engine, tokens, step.iteration, time.monotonic())

    def deliver(self, out: RequestOutput) -> None:
        with self.lock:
            a = self.active.get(out.request_id)
            if a is None:
                return
            if out.finished:
                del self.active[out.request_id]
        if out.finished and out.finish_reason not in (FinishReason.ABORT, FinishReason.ERROR):
            try:
                self._record(out)
            except Exception:
                log.exception("recording metrics failed")
        # a rejection never follows a data response (the scheduler's promise)
        if (error := output_error(out)) is not None:
            self.responses.error(a.sender, error[1], error[0])
            return
        a.logprobs.extend(out.new_logprobs or ())
        if out.prompt_logprobs is not None:
            a.prompt_logprobs = out.prompt_logprobs
        if a.options.stream:
            if self._paces(a, out):
                self._send_paced(a, out)
                return
            if self._holds(a, out):
                a.stream.hold(out.new_token_ids)
                a.held_since, a.last = a.held_since or out.emit_time, out
                return
            rendered = a.stream.push(self.tokenizer, out.new_token_ids, final=out.finished)
            if rendered is None:
                return
            a.held_since, a.last_sent = None, time.monotonic()
        else:
            a.output_ids.extend(out.new_token_ids)
            if not out.finished:
                return
            ids = a.output_ids if a.options.exclude_input_in_output else a.prompt_ids + a.output_ids
            rendered = Rendered([], ids, text_delta(self.tokenizer, [], ids))
        self._send(a, out, rendered)

    def _paces(self, a: Active, out: RequestOutput) -> bool:
        """StreamingConfig.pace: a direct caller's stream with a TPOT target, until its last output."""
        if a.pace is None and self.pace and a.watched and out.slo.tpot_s is not None:
            a.pace = StreamPace.for_target(out.slo.tpot_s)
        return a.pace is not None and not out.finished

    def _send_paced(self, a: Active, out: RequestOutput) -> None:
        """One response per token that renders text, each leaving at its time (serving/pacing.py), each
        counting the output tokens sent through it."""
        pieces = [r for t in out.new_token_ids if (r := a.stream.push(self.tokenizer, [t], final=False))]
        times = a.pace.release_times(time.monotonic(), len(pieces), len(out.new_token_ids))
        counted = out.num_output_tokens - len(a.stream.held) - sum(len(r.ids) for r in pieces)
        for rendered, at in zip(pieces, times):
            counted += len(rendered.ids)
            self._send(a, replace(out, num_output_tokens=counted), rendered, at)

    def _send(self, a: Active, out: RequestOutput, rendered: Rendered, at: float | None = None) -> None:
        logprobs = None
        if a.wants_logprobs:  # those of the output tokens this response carries, in order
            n = len(rendered.ids) if a.options.stream else len(a.output_ids)
            logprobs, a.logprobs = a.logprobs[:n], a.logprobs[n:]
        if a.prompt_logprobs is not None:  # on the first response that leaves
            out, a.prompt_logprobs = replace(out, prompt_logprobs=a.prompt_logprobs), None
        tensors = response_tensors(out, a.options, rendered, self.clock_offset_ns, logprobs, a.prompt_ids)
        self.responses.send(a.sender, reply(self.pb, (self.pb.Tensor(k, v) for k, v in tensors.items())),
                            final=out.finished, at=at)

    def _holds(self, a: Active, out: RequestOutput) -> bool:
        """Coalescing (StreamingConfig.max_hold_ms): never the first visible token nor the last."""
        if not self.max_hold_ms or out.finished or not a.stream.rendered:
            return False
        return not self._due(a, a.held_since or out.emit_time, time.monotonic(), out)

    def _due(self, a: Active, held_since: float, now: float, out: RequestOutput) -> bool:
        """The configured hold, and never a silence longer than the request's own TPOT target."""
        return must_send(held_since, now, self.next_step_s or 0.0, self.max_hold_ms / 1e3, a.last_sent, out.slo.tpot_s)

    def _send_due(self, now: float) -> None:
        """Held tokens whose hold would run out before the next step ends leave now, output or not."""
        with self.lock:
            held = [a for a in self.active.values() if a.held_since is not None]
        for a in held:
            if self._due(a, a.held_since, now, a.last):
                rendered = a.stream.push(self.tokenizer, [], final=False)
                if rendered is not None:
                    a.held_since, a.last_sent = None, now
                    self._send(a, a.last, rendered)

    def _record(self, out: RequestOutput) -> None:
        rejected = out.finish_reason == FinishReason.REJECTED
        first = out.first_token_time or out.emit_time
        ttft = None if rejected else first - out.arrival_time
        tpot = tpot_seconds(first, out.emit_time, out.num_output_tokens)
        tpot_attained = not rejected and attains(tpot, out.slo.tpot_ms)
        label = out.slo.slo_class
        if label == "custom":
            label = self.class_of_targets.get((out.slo.tpot_ms, out.slo.ttft_ms), label)
        self.metrics.on_finish(Finished(
            label, out.num_prompt_tokens, out.num_output_tokens, ttft, tpot,
            out.emit_time - out.arrival_time, out.stats.queue_wait_s, attains_ttft(ttft, out.slo.ttft_ms),
            tpot_attained, rejected, out.stats.overload, out.stats.predicted_ttft_s, out.stats.predicted_length,
        ))


def _string(arr) -> str:
    value = arr.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
