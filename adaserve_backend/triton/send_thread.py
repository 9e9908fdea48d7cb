"""The decoupled model's responses leave from one thread of their own, in the order they were queued:
Triton's execute and the engine loop only queue them, so neither ever waits on a slow or vanished client.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import NamedTuple

from ..serving.errors import ErrorKind
from .protocol import ERROR_OUTPUT, error_tensor

log = logging.getLogger("adaserve")


class Reply(NamedTuple):
    """A response and the Python tensor objects it carries, which whoever sends it keeps referenced until
    the send has returned. Why: the backend's send (ResponseSender::Send) drops the outputs the requester
    did not ask for with the GIL released, and if the response held the last reference to such a
    tensor, its numpy array is freed right there, racing the interpreter: the engine model's stub died of
    heap corruption under load (a segfault in libpython, or glibc's "unaligned fastbin chunk"), since
    the pipeline asks the scheduler model for its text and not for the ids (docs/triton.md#shutdown).
    Released by Python afterwards, they are freed under the GIL."""

    response: object
    tensors: tuple = ()


def reply(pb, tensors) -> Reply:
    """A response of `tensors` (pb.Tensor objects), kept with them."""
    tensors = tuple(tensors)
    return Reply(pb.InferenceResponse(output_tensors=list(tensors)), tensors)


def unwrapped(response):
    """The backend's response object of a Reply (anything else as it is)."""
    return response.response if isinstance(response, Reply) else response


class SendThread:
    def __init__(self, pb, name: str = "adaserve-responses") -> None:
        self.pb = pb
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def send(self, sender, response, final: bool) -> None:
        """`response` None: an empty final flag (the answer to an abort); a Reply stays referenced, its
        tensors with it, until its send has returned."""
        self._queue.put((sender, response, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0))

    def error(self, sender, message: str, kind: ErrorKind) -> None:
        """A final error, as an `error` output rather than a Triton error (see protocol.ERROR_OUTPUT)."""
        self.send(sender, reply(self.pb, [self.pb.Tensor(ERROR_OUTPUT, error_tensor(message, kind))]), final=True)

    def close(self, timeout: float) -> None:
        """Send what is queued, then stop (waiting at most `timeout` seconds)."""
        self._queue.put(None)
        self.thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            sender, response, flags = item
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(unwrapped(response), flags=flags)
            except Exception:  # the client is gone; its request was or will be cancelled
                log.warning("could not send a response", exc_info=True)
