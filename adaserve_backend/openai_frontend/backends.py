"""What the OpenAI frontend serves from: a backend turns one parsed `Generation` into a stream of text
deltas. Two exist: Triton's `adaserve` model over gRPC (triton_backend.py, `make serve`), and engine replicas
on Ray Serve behind an SLO-aware router (adaserve_backend/ray_serve, `make serve-ray`). Both end every
request the same way: a `BackendError` of an ErrorKind (serving/errors.py), which the frontend maps
to one HTTP answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ..serving.errors import ErrorKind
from .field_readers import OpenAIError
from .params import Generation, Prompt

RETRY_AFTER_S = 1


class BackendError(RuntimeError):
    """A request's error, of its kind."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INTERNAL) -> None:
        super().__init__(message)
        self.message, self.kind = message, kind


OPENAI_TYPES = {ErrorKind.INVALID_ARG: "invalid_request_error", ErrorKind.NOT_FOUND: "not_found_error"}


def http_error(e: BackendError) -> OpenAIError:
    """By the kind alone; an overload or a stopping server is 503 with Retry-After."""
    if e.kind is ErrorKind.UNAVAILABLE:
        return OpenAIError(503, e.message, kind="server_overloaded", retry_after_s=RETRY_AFTER_S)
    return OpenAIError(e.kind.http, e.message, kind=OPENAI_TYPES.get(e.kind, "internal_error"))


class Backend(Protocol):
    async def connect(self) -> None:
        """Called on the frontend's event loop before the first request."""

    async def close(self) -> None: ...

    async def unhealthy(self) -> str | None:
        """Why the backend cannot serve now, or None."""

    def stream(self, gen: Generation, prompt: Prompt) -> AsyncIterator[tuple[str, dict]]:
        """(text delta, extras) per response; extras may carry num_input_tokens, num_output_tokens and
        finish_reason. Raises BackendError; closing the iterator aborts the request."""
