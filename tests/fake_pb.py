"""A stand-in for Triton's `triton_python_backend_utils`: enough of it to drive the `adaserve` model's
engine loop and the front pipeline in-process, recording every response sent."""

from __future__ import annotations

import sys
import threading

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class TritonError:
    """The installed Python backend's codes (its stub defines exactly these); INTERNAL is the default."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = (
        "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")

    def __init__(self, message, code=INTERNAL):
        self._message, self._code = message, code

    def message(self):
        return self._message

    def code(self):
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self._outputs, self._error = list(output_tensors), error

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def tensors(self) -> dict:
        return {t.name(): t.as_numpy() for t in self._outputs}


class Sender:
    """Records (response, flags); `finished` is set by the FINAL flag; a second FINAL is an error."""

    def __init__(self):
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.cancelled = False
        self.finished = threading.Event()

    def send(self, response=None, flags=0):
        assert not self.finished.is_set(), "a response after the final one"
        # The real send drops the outputs nobody requested with the GIL released; a tensor the response
        # alone references would be freed there (send_thread.Reply): the caller must hold each one.
        # References here: the response's list, the loop variable, getrefcount's argument.
        for t in response.output_tensors() if response is not None else ():
            assert sys.getrefcount(t) > 3, f"tensor {t.name()!r} referenced by its response alone during the send"
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.finished.set()

    def is_cancelled(self):
        return self.cancelled


class Request:
    def __init__(self, **inputs):
        self.inputs = {k: np.asarray(v) for k, v in inputs.items()}
        self.sender = Sender()

    def get_response_sender(self):
        return self.sender


def get_input_tensor_by_name(request, name):
    return Tensor(name, request.inputs[name]) if name in request.inputs else None


class _Metric:
    def __init__(self, **kw):
        self.value = 0.0

    def increment(self, v):
        self.value += v

    def set(self, v):
        self.value = v

    def observe(self, v):
        self.value = v


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels=None, buckets=None):  # noqa: N802  (pb_utils' spelling)
        return _Metric()


def get_output_tensor_by_name(response, name):
    return next((t for t in response.output_tensors() if t.name() == name), None)


# BLS: model name -> handler(inputs: dict[str, np.ndarray], decoupled: bool) -> a response, or an
# iterable of responses for a decoupled call. Tests install the models their pipeline calls.
MODELS: dict = {}
# False once the server is stopping: Triton then refuses new inferences, BLS calls included; what a
# called model still sends for a request already running reaches its caller.
SERVER_READY = True


class InferenceRequest:
    def __init__(self, model_name, inputs, requested_output_names=()):
        self.model_name, self.inputs = model_name, {t.name(): t.as_numpy() for t in inputs}
        self.requested = set(requested_output_names)

    def exec(self, decoupled=False):
        if not SERVER_READY:
            message = f"Model {self.model_name} - Server not ready"
            error = InferenceResponse(error=TritonError(message, TritonError.UNAVAILABLE))
            return iter([error]) if decoupled else error
        if self.model_name not in MODELS:  # as Triton 2.51's Python backend words it
            error = InferenceResponse(error=TritonError(f"Model {self.model_name} - Error when running inference: "
                                                        f"Failed for execute the inference request. Model "
                                                        f"'{self.model_name}' is not ready."))
            return iter([error]) if decoupled else error
        result = MODELS[self.model_name](self.inputs, decoupled)
        return (_bls(r, self.requested) for r in result) if decoupled else _bls(result, self.requested)


def _bls(response, requested: set[str]):
    """What a BLS caller gets: as in Triton 2.51's Python backend, an error keeps its message, not its code;
    only the outputs it asked for (all when it named none)."""
    if response is not None and response.has_error():
        return InferenceResponse(error=TritonError(response.error().message()))
    if response is not None and requested:
        return InferenceResponse([t for t in response.output_tensors() if t.name() in requested])
    return response


class StreamSender(Sender):
    """A sender whose responses a BLS caller iterates, as Triton hands a decoupled model's responses
    to the model that called it."""

    def __init__(self):
        super().__init__()
        import queue

        self.queue = queue.Queue()

    def send(self, response=None, flags=0):
        super().send(response, flags)
        if response is not None and response.has_error() and len(self.sent) > 1:
            return  # lost on its way, as on 2.51, FINAL flag and all (see protocol.ERROR_OUTPUT)
        if response is not None:
            self.queue.put(response)
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.queue.put(None)

    def __iter__(self):
        while (item := self.queue.get()) is not None:
            yield item
