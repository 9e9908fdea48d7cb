"""The decoupled model's responses leave from one thread of their own, in the order they were queued:
Triton's execute and the engine loop only queue them, so neither ever waits on a slow or vanished client.
"""

from __future__ import annotations

import logging
import queue
import threading

from ..serving.errors import ErrorKind
from .protocol import ERROR_OUTPUT, error_tensor

log = logging.getLogger("adaserve")


class SendThread:
    def __init__(self, pb, name: str = "adaserve-responses") -> None:
        self.pb = pb
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def send(self, sender, response, final: bool) -> None:
        """`response` None: an empty final flag (the answer to an abort)."""
        self._queue.put((sender, response, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0))

    def error(self, sender, message: str, kind: ErrorKind) -> None:
        """A final error, as an `error` output rather than a Triton error (see protocol.ERROR_OUTPUT)."""
        tensor = self.pb.Tensor(ERROR_OUTPUT, error_tensor(message, kind))
        self.send(sender, self.pb.InferenceResponse(output_tensors=[tensor]), final=True)

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
                    sender.send(response, flags=flags)
            except Exception:  # the client is gone; its request was or will be cancelled
                log.warning("could not send a response", exc_info=True)
