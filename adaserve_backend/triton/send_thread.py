"""The decoupled model's responses leave from one thread of their own, in the order they were queued:
Triton's execute and the engine loop only queue them, so neither ever waits on a slow or vanished client.
A response may be queued to leave at a later time (a paced stream, serving/pacing.py): it waits here,
while the engine steps, and whatever is queued later for the same request without a time leaves after it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
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

    def send(self, sender, response, final: bool, at: float | None = None) -> None:
        """`response` None: an empty final flag (the answer to an abort); a Reply stays referenced, its
        tensors with it, until its send has returned. `at`: not before this time (time.monotonic());
        a sender's timed responses must be queued in the order of their times."""
        self._queue.put((sender, response, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0, at))

    def error(self, sender, message: str, kind: ErrorKind) -> None:
        """A final error, as an `error` output rather than a Triton error (see protocol.ERROR_OUTPUT)."""
        self.send(sender, reply(self.pb, [self.pb.Tensor(ERROR_OUTPUT, error_tensor(message, kind))]), final=True)

    def close(self, timeout: float) -> None:
        """Send what is queued, then stop (waiting at most `timeout` seconds)."""
        self._queue.put(None)
        self.thread.join(timeout=timeout)

    def _run(self) -> None:
        waiting: list = []  # heap of (at, order, sender, response, flags): responses not yet due
        order = itertools.count()
        while True:
            timeout = max(waiting[0][0] - time.monotonic(), 0.0) if waiting else None
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = ()
            if item is None:  # closing: everything still waiting leaves now, in order
                for _, _, sender, response, flags in sorted(waiting):
                    self._deliver(sender, response, flags)
                return
            if item:
                sender, response, flags, at = item
                if at is not None and at > time.monotonic():
                    heapq.heappush(waiting, (at, next(order), sender, response, flags))
                else:  # after what waits for the same request
                    before = sorted(e for e in waiting if e[2] is sender)
                    if before:
                        waiting = [e for e in waiting if e[2] is not sender]
                        heapq.heapify(waiting)
                    for entry in before:
                        self._deliver(*entry[2:])
                    self._deliver(sender, response, flags)
            now = time.monotonic()
            while waiting and waiting[0][0] <= now:
                self._deliver(*heapq.heappop(waiting)[2:])

    def _deliver(self, sender, response, flags: int) -> None:
        try:
            if response is None:
                sender.send(flags=flags)
            else:
                sender.send(unwrapped(response), flags=flags)
        except Exception:  # the client is gone; its request was or will be cancelled
            log.warning("could not send a response", exc_info=True)
