"""Whether Triton still serves a model, for models that hold requests across `execute` calls.

Why: on SIGTERM/SIGINT Triton refuses new inferences (BLS included) and unloads each model, calling its
`finalize`, only once the model's requests are released, and a decoupled request is released by its
final response. A model that answers its in-flight requests only in `finalize` therefore waits out the
server's 30 s exit timeout. Its readiness is what changes first, so the models ask for it while they
hold requests and end them themselves.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("adaserve")

CHECK_EVERY_S = 0.25  # one IPC to the server per check; requests end within this of a shutdown
SHUTTING_DOWN = "the server is shutting down"


class ServingWatch:
    def __init__(self, pb, model_name: str) -> None:
        self.pb, self.model_name = pb, model_name
        self._checked, self._stopping = 0.0, False

    @property
    def stopped(self) -> bool:
        """What the last check found (no IPC)."""
        return self._stopping

    def stopping(self, fresh: bool = False) -> bool:
        """True once the server no longer serves the model (asked at most every CHECK_EVERY_S, unless
        `fresh`: after a failure, to tell a stopping server from a fault)."""
        now = time.monotonic()
        if self._stopping or (not fresh and now - self._checked < CHECK_EVERY_S):
            return self._stopping
        self._checked = now
        try:
            self._stopping = not self.pb.is_model_ready(self.model_name)
        except AttributeError:  # a backend without is_model_ready: finalize remains the only signal
            return False
        except Exception as e:  # the server answers with an error while it stops ("Server not ready")
            log.info("%s: readiness check failed (%s): ending its requests", self.model_name, e)
            self._stopping = True
        if self._stopping:
            log.info("%s is no longer served: ending its requests", self.model_name)
        return self._stopping
