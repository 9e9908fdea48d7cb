"""The client-facing `ensemble` model: a decoupled BLS pipeline preprocessing -> adaserve ->
postprocessing, with the same inputs and outputs a Triton ensemble would expose.

Where each response's text comes from (`detokenizer`, the model's config parameter): "scheduler" (the
default) passes on the text the scheduler model rendered in its stream; "postprocessing" calls the
detokenizer model once per response. Why the default: on 2 cores every process hop a token takes is
felt by the engine's threads; a per-response BLS call to the detokenizer slows served decode iterations,
and the same ids would be decoded twice, once in each model (docs/triton.md#decoupled-streaming).

Why not `platform: "ensemble"`: Triton 2.51's ensemble scheduler does not forward a client's
cancellation to an in-flight decoupled step (the server log shows the gRPC handler dropping the
responses while the step runs on), so a cancelled stream would hold its KV blocks until max_tokens.
Here the pipeline sees its own request's cancellation and asks the scheduler to abort by request id.

Each request runs on its own thread (BLS calls block); a watcher thread polls cancellation.

Shutdown order: a client's final response is the last thing its request thread does, after the
scheduler model's stream has ended. Why (read in the 2.51 Python backend, python_be.cc): Triton
unloads this model once its client requests are answered, without waiting for the BLS streams they
opened; the unload first joins the model's BLS thread pool, so a BLS call made after the answer never
returns, and a response still arriving on such a stream is handed to a stub that is exiting
(SendBLSDecoupledResponse waits for it without a bound, which keeps the scheduler model from
unloading).

Every BLS stream is kept referenced from Python for RETIRE_S after it ends (`_retire`). Why (read in
the 2.51 stub and caught in gdb: SIGABRT "double free" in ParentToStubMQMonitor while the thread that
serves stub-to-parent requests ran ~ResponseIterator from SendCleanupId): a stream's iterator keeps
every response it returned, and the stub drops its own reference to a finished iterator on a thread
that does not hold the GIL. If Python dropped its reference first, the iterator and the numpy arrays of
all its responses are freed on that thread, racing the interpreter; under load this crashed the
pipeline's stub (docs/triton.md#shutdown), and every later request failed ("Stub process is not
healthy"). Released by Python, the destruction runs under the GIL.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque

import numpy as np

from ..request import INTERNAL_ERROR
from ..serving.errors import SHUTTING_DOWN, ErrorKind
from .cancellation import CancellationWatcher
from .protocol import ACK_INPUT, ERROR_OUTPUT, INPUT_NAMES, TEXT_OUTPUT, response_error
from .protocol import PASS_THROUGH_OUTPUTS as PASS_THROUGH
from .send_thread import Reply, reply, unwrapped
from .shutdown_probe import SERVER_NOT_READY, ShutdownProbe

log = logging.getLogger("adaserve")
# How long finalize waits for request threads still reading the scheduler model's stream (Triton's own
# exit timeout is 30 s). Finalize normally comes after every stream ended (see the module docstring).
DRAIN_TIMEOUT_S = 3.0
# The scheduler model ends its requests within a step of the end of the drain's grace; a client whose
# request it has not ended this long after that is answered anyway (at the risk the module docstring
# describes).
ANSWER_AFTER_S = 5.0
# A finished BLS stream stays referenced this long (see the module docstring); the stub's cleanup of
# it follows its final response by milliseconds.
RETIRE_S = 2.0
DETOKENIZERS = ("scheduler", "postprocessing")

class BLSPipeline:
    def __init__(self, pb, model_name: str = "ensemble", detokenizer: str = "scheduler",
                 drain_grace_s: float = 0.0) -> None:
        """`drain_grace_s`: the scheduler model's (config/drain.py), which this model waits out too."""
        if detokenizer not in DETOKENIZERS:
            raise ValueError(f"detokenizer must be one of {DETOKENIZERS}, got {detokenizer!r}")
        self.pb = pb
        self.scheduler_text = detokenizer == "scheduler"
        self.shutdown_probe = ShutdownProbe(pb, model_name)
        self.drain_grace_s = drain_grace_s
        self.active: dict[str, object] = {}  # request id -> response sender
        self.lock = threading.Lock()
        self.stopping = False
        self.runs = 0  # request threads alive, under `idle`
        self.idle = threading.Condition()
        self.retired: deque[tuple[float, object]] = deque()  # (when, BLS stream), oldest first
        self._aborted: set[str] = set()
        self._stopped_at: float | None = None
        self.watcher = CancellationWatcher("adaserve-cancel-watch", self.lock,
                                           self._cancellation_candidates, self.active.get,
                                           self._cancel, lambda: self.stopping, self._between_sweeps).start()

    def submit(self, request) -> None:
        arrival_ns = time.time_ns()  # the scheduler's first-token deadline counts from here (protocol._arrival)
        sender = request.get_response_sender()
        request_id = uuid.uuid4().hex
        with self.lock:
            self.active[request_id] = sender
        with self.idle:
            self.runs += 1
        threading.Thread(target=self._run_counted, args=(request, sender, request_id, arrival_ns), daemon=True).start()

    def shutdown(self) -> None:
        self.stopping = True
        self.watcher.thread.join(timeout=1)
        self._answer_all()
        # Why wait: a request thread may still be reading the scheduler model's stream to its end
        # (_drain). Responses that arrive after this model's stub has exited land in freed shared
        # memory, and the server aborts (the failure: boost lock_exception, SIGABRT).
        with self.idle:
            if not self.idle.wait_for(lambda: self.runs == 0, timeout=DRAIN_TIMEOUT_S):
                log.warning("pipeline shutdown: %d request threads still reading after %.0f s",
                            self.runs, DRAIN_TIMEOUT_S)

    def _answer_all(self) -> None:
        """End every client request still waiting with a final error: the server is stopping and
        refuses new inferences (BLS included), so what the scheduler model would still send may never
        arrive."""
        if not self.lock.acquire(timeout=1):  # the watcher may be stuck in is_cancelled(); do not wait on it
            log.warning("pipeline shutdown: lock busy, in-flight requests not answered")
            return
        try:
            pending, self.active = self.active, {}
        finally:
            self.lock.release()
        error = self.pb.InferenceResponse(error=self._error(ErrorKind.UNAVAILABLE, SHUTTING_DOWN))
        for sender in pending.values():
            try:
                sender.send(error, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:
                log.warning("could not send the final response", exc_info=True)

    # ---- one request ----------------------------------------------------------------------------
    def _run_counted(self, request, sender, request_id: str, arrival_ns: int) -> None:
        try:
            final = self._run(request, sender, request_id, arrival_ns)
            self._finish(sender, request_id, final)  # last: the scheduler model's stream has ended
        finally:
            with self.idle:
                self.runs -= 1
                self.idle.notify_all()

    def _run(self, request, sender, request_id: str, arrival_ns: int):
        """Stream the request's outputs to the client; returns its final response (None: flags only)."""
        pb = self.pb
        stream = opened = None  # the scheduler model's stream, read to its final response unless it ended
        shutting_down = False
        try:
            ids = self._preprocess(request)
            inputs = [pb.Tensor("input_ids", ids),
                      pb.Tensor("request_id", np.array([request_id.encode()], dtype=object)),
                      pb.Tensor("arrival_time_ns", np.array([arrival_ns], dtype=np.int64)),
                      pb.Tensor(ACK_INPUT, np.array([True]))]  # frees the backend's thread at once (config.pbtxt)
            for name in INPUT_NAMES[1:]:
                t = pb.get_input_tensor_by_name(request, name)
                if t is not None:
                    inputs.append(pb.Tensor(name, t.as_numpy()))
            rendering = [TEXT_OUTPUT] if self.scheduler_text else ["output_ids", "context_ids"]  # for postprocessing
            wanted = ["is_final", ERROR_OUTPUT, *PASS_THROUGH, *rendering]
            stream = opened = pb.InferenceRequest(model_name="adaserve", inputs=inputs,
                                                  requested_output_names=wanted).exec(decoupled=True)
            for response in stream:
                if (error := response_error(response)) is not None:
                    stream = None
                    return pb.InferenceResponse(error=self._error(*error))
                tensors = {t.name(): t for t in response.output_tensors()}
                if not tensors or request_id not in self.active:
                    continue  # the acceptance ack, a flags-only final response, or answered already: read on
                if bool(tensors["is_final"].as_numpy().reshape(-1)[0]):
                    stream = None
                    return self._postprocess(tensors)
                self._send(sender, request_id, self._postprocess(tensors))
            stream = None
            return None
        except ValueError as e:  # the client's input (preprocessing refused it)
            return pb.InferenceResponse(error=self._error(ErrorKind.INVALID_ARG, str(e)))
        except Exception as e:  # never leave a client without a final response
            # A stopping server refuses BLS calls at once ("Server not ready"), before the models
            # stop being ready, which is why both are asked.
            shutting_down = SERVER_NOT_READY in str(e) or self.shutdown_probe.stopping(fresh=True)
            if shutting_down:
                error = self._error(ErrorKind.UNAVAILABLE, SHUTTING_DOWN)
            else:
                log.exception("pipeline failed")
                error = self._error(ErrorKind.INTERNAL, INTERNAL_ERROR)
            return pb.InferenceResponse(error=error)
        finally:
            if stream is not None:  # we stopped listening before its end (postprocessing failed...)
                # a stopping server refuses BLS; the scheduler ends it
                if not (shutting_down or self.shutdown_probe.stopped):
                    self._abort(request_id)  # frees its KV blocks
                self._drain(stream)
            self._retire(opened)

    def _retire(self, stream) -> None:
        if stream is not None:
            self.retired.append((time.monotonic(), stream))

    def _release_retired(self) -> None:
        """Drops streams retired RETIRE_S ago, on a Python thread (see the module docstring)."""
        cutoff = time.monotonic() - RETIRE_S
        while self.retired and self.retired[0][0] < cutoff:
            self.retired.popleft()

    @staticmethod
    def _drain(stream) -> None:
        """Read an abandoned stream to its final response. Why: a BLS stream left unread keeps the
        scheduler model's responses alive, and with them both models, which then never unload, so a
        stopping server waits out its exit timeout. Bounded: the scheduler ends every request it holds
        once it is aborted or the server stops."""
        try:
            for _ in stream:
                pass
        except Exception:
            log.warning("draining an abandoned stream failed", exc_info=True)

    def _error(self, kind: ErrorKind, message: str):
        """An error of `kind` for the client: this model's own, or the scheduler model's with its code
        restored (see protocol.CODE_TAG)."""
        return self.pb.TritonError(message, getattr(self.pb.TritonError, kind.triton))

    def _preprocess(self, request) -> np.ndarray:
        """The prompt's ids: `preprocessing`'s of its text, or the client's own `input_ids` as they are."""
        pb = self.pb
        ids = pb.get_input_tensor_by_name(request, "input_ids")
        if (ids is None) == (pb.get_input_tensor_by_name(request, "text_input") is None):
            raise ValueError("send exactly one of 'text_input' and 'input_ids'")
        if ids is not None:
            if pb.get_input_tensor_by_name(request, "apply_chat_template") is not None:
                raise ValueError("apply_chat_template applies to text_input, not input_ids")
            return ids.as_numpy().reshape(-1).astype(np.int32)
        inputs = [pb.Tensor(name, t.as_numpy()) for name in ("text_input", "apply_chat_template")
                  if (t := pb.get_input_tensor_by_name(request, name)) is not None]
        response = pb.InferenceRequest(model_name="preprocessing", inputs=inputs,
                                       requested_output_names=["input_ids"]).exec()
        if response.has_error():
            message = response.error().message()
            raise (RuntimeError if SERVER_NOT_READY in message else ValueError)(message)
        return pb.get_output_tensor_by_name(response, "input_ids").as_numpy()

    def _postprocess(self, tensors: dict):
        pb = self.pb
        if TEXT_OUTPUT in tensors:  # rendered by the scheduler model
            return reply(pb, (pb.Tensor(name, tensors[name].as_numpy())
                              for name in (TEXT_OUTPUT, *PASS_THROUGH) if name in tensors))
        inputs = [pb.Tensor(name, t.as_numpy()) for name, t in tensors.items() if name != "is_final"]
        wanted = [TEXT_OUTPUT, *[n for n in PASS_THROUGH if n in tensors]]
        response = pb.InferenceRequest(model_name="postprocessing", inputs=inputs, requested_output_names=wanted).exec()
        if response.has_error():
            raise RuntimeError(response.error().message())
        return reply(pb, (pb.Tensor(t.name(), t.as_numpy()) for t in response.output_tensors()))

    def _send(self, sender, request_id: str, response: Reply) -> None:
        """A data response, unless the request was already answered (its sender may be freed)."""
        with self.lock:
            if request_id in self.active:
                sender.send(response.response)  # `response` keeps its tensors referenced (send_thread.Reply)

    def _finish(self, sender, request_id: str, response) -> None:
        # Under the lock: Triton frees a sender's response factory once the final response is sent,
        # and is_cancelled() on a freed factory crashes the server (a crash under load), so the watcher
        # must never hold a sender past its final send.
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self.lock:
            if self.active.pop(request_id, None) is None:
                return  # already answered (shutdown)
            try:
                sender.send(unwrapped(response), flags=flags) if response is not None else sender.send(flags=flags)
            except Exception:
                log.warning("could not send the final response", exc_info=True)

    # ---- cancellation ---------------------------------------------------------------------------
    def _cancellation_candidates(self) -> set[str]:
        """Live requests not aborted yet (called under the lock)."""
        live = set(self.active)
        self._aborted &= live
        return live - self._aborted

    def _cancel(self, request_id: str) -> None:
        self._aborted.add(request_id)
        self._abort(request_id)

    def _between_sweeps(self) -> bool:
        """Drop retired streams; once the server stops, skip cancellation (a stopping server refuses the
        abort's BLS call: a client that leaves during the drain is generated for until its request ends)
        and answer what the scheduler model has not ended ANSWER_AFTER_S after the drain's grace (it ends
        each request itself, and the request thread answers its client after that: see the module
        docstring)."""
        self._release_retired()
        if not (self.active and self.shutdown_probe.stopping()):  # see shutdown_probe.py
            return False
        self._stopped_at = self._stopped_at or time.monotonic()
        if time.monotonic() - self._stopped_at > self.drain_grace_s + ANSWER_AFTER_S:
            self._answer_all()
        return True

    def _abort(self, request_id: str) -> None:
        pb = self.pb
        try:
            tensor = pb.Tensor("abort_request_id", np.array([request_id.encode()], dtype=object))
            stream = pb.InferenceRequest(model_name="adaserve", inputs=[tensor],
                                         requested_output_names=[]).exec(decoupled=True)
            self._retire(stream)
            for _ in stream:
                pass
        except Exception:
            log.warning("abort of %s failed", request_id, exc_info=True)
