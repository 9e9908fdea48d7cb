"""A request's error, named once: each kind of failure with the code it carries on every wire (the
Python backend's TritonError code, the gRPC status, the HTTP status), and the kind each way an engine
ends a request maps to. Every front end (the Triton models, the gRPC client, the OpenAI frontend, the
Ray replicas) converts through this table and nowhere else."""

from __future__ import annotations

from enum import Enum

from ..request import FinishReason, RequestOutput

SHUTTING_DOWN = "the server is shutting down"
ENGINE_DEAD = "the engine is not running (it failed repeatedly; see the server's log)"
CANCELLED = "request cancelled"


class ErrorKind(Enum):
    """(TritonError code name, gRPC status name, HTTP status)."""

    INVALID_ARG = ("INVALID_ARG", "INVALID_ARGUMENT", 400)  # the client's input
    NOT_FOUND = ("NOT_FOUND", "NOT_FOUND", 404)
    UNAVAILABLE = ("UNAVAILABLE", "UNAVAILABLE", 503)  # overload, a stopping server, a dead engine: retry later
    CANCELLED = ("CANCELLED", "CANCELLED", 499)  # the client went away (nginx's code: no one reads it)
    INTERNAL = ("INTERNAL", "INTERNAL", 500)  # a fault of ours; the message never carries internals

    @property
    def triton(self) -> str:
        return self.value[0]

    @property
    def grpc(self) -> str:
        return self.value[1]

    @property
    def http(self) -> int:
        return self.value[2]

    @classmethod
    def from_triton(cls, name: str | None) -> ErrorKind:
        """By TritonError code name; anything unknown (or none) is INTERNAL."""
        return next((k for k in cls if k.triton == name), cls.INTERNAL)

    @classmethod
    def from_grpc(cls, name: str | None) -> ErrorKind:
        """By gRPC status name; RESOURCE_EXHAUSTED is an overload too, anything unknown INTERNAL."""
        if name == "RESOURCE_EXHAUSTED":
            return cls.UNAVAILABLE
        return next((k for k in cls if k.grpc == name), cls.INTERNAL)


def output_error(out: RequestOutput) -> tuple[ErrorKind, str] | None:
    """How a finished output that is an error reaches the client, None for a normal end. A rejection
    (the scheduler's overload answer) and a server that stops or whose engine died are UNAVAILABLE;
    an abort is CANCELLED; any other failure INTERNAL."""
    reason = out.finish_reason
    if reason == FinishReason.ABORT:
        return ErrorKind.CANCELLED, CANCELLED
    if reason == FinishReason.REJECTED:
        return ErrorKind.UNAVAILABLE, out.error or "rejected"
    if reason == FinishReason.ERROR:
        unavailable = out.error in (SHUTTING_DOWN, ENGINE_DEAD)
        return (ErrorKind.UNAVAILABLE if unavailable else ErrorKind.INTERNAL), out.error or "request failed"
    return None
