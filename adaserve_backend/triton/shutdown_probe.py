"""Whether Triton still serves a model, for models that hold requests across `execute` calls.

Why: on SIGTERM/SIGINT Triton refuses new inferences (BLS included) and unloads each model, calling its
`finalize`, only once the model's requests are released, and a decoupled request is released by its
final response. A model that answers its in-flight requests only in `finalize` therefore waits out the
server's 30 s exit timeout. So the models ask, while they hold requests, and end them themselves.

How they ask: a BLS call to a model that does not exist, which Triton refuses at once, "not ready"
while it serves and "Server not ready" once it stops. Why not `pb_utils.is_model_ready`: once the
server stops it fails with that same error, and in the 2.51 Python backend (still so upstream) a
failing model-control request frees its error message in shared memory while the stub may still read
it (`Stub::SendMessage` reads `msg->error` after releasing the parent, whose `ProcessMessage` then
frees it). The likely cause of shutdowns that aborted the server (boost::interprocess::lock_exception)
or segfaulted within a second of the first failing checks; they stopped with this probe (evidence:
docs/triton.md#shutdown). A failing BLS call hands its error over before it releases the
parent (`ExecuteBLSRequest`), so the probe does not race.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("adaserve")

CHECK_EVERY_S = 0.25  # one BLS call per check; requests end within this of a shutdown
SERVER_NOT_READY = "Server not ready"  # Triton's answer to a BLS call once the server stops
PROBE_MODEL = "adaserve-serving-probe"  # no model has this name


class ShutdownProbe:
    def __init__(self, pb, model_name: str) -> None:
        self.pb, self.model_name = pb, model_name
        self._checked, self._stopping = 0.0, False
        self.server_stopped = False  # Triton itself said it stops (not only this model's unload)
        self.last_served_at: float | None = None  # when the last check that found it serving began

    @property
    def stopped(self) -> bool:
        """What the last check found (no IPC)."""
        return self._stopping

    def noticed_late_s(self) -> float:
        """How long ago the server was last seen serving: the most by which the stop preceded its notice
        (0 when it never was seen serving)."""
        return time.monotonic() - self.last_served_at if self.last_served_at is not None else 0.0

    def stopping(self, fresh: bool = False) -> bool:
        """True once the server no longer serves the model (asked at most every CHECK_EVERY_S, unless
        `fresh`: after a failure, to tell a stopping server from a fault)."""
        now = time.monotonic()
        if self._stopping or (not fresh and now - self._checked < CHECK_EVERY_S):
            return self._stopping
        self._checked = now
        try:
            probe = self.pb.InferenceRequest(model_name=PROBE_MODEL, inputs=[], requested_output_names=[]).exec()
            self._stopping = probe.has_error() and SERVER_NOT_READY in probe.error().message()
            self.server_stopped = self._stopping
        except Exception as e:  # BLS refused altogether (a finalizing stub): stopping as well
            log.info("%s: serving check failed (%s): ending its requests", self.model_name, e)
            self._stopping = True
        if self._stopping:
            log.info("%s is no longer served: ending its requests", self.model_name)
        else:
            self.last_served_at = now  # the stop, when it comes, comes after this
        return self._stopping
