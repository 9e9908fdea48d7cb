"""Reading one field of an OpenAI request body: numbers, integers and flags in their bounds, text that
is valid Unicode, and the OpenAI-style 400 naming the field when it is not. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping


class OpenAIError(Exception):
    """An error response in OpenAI's shape; `retry_after_s` becomes a Retry-After header."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind, self.retry_after_s = kind, retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param)


def number(body: Mapping, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    try:
        f = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:  # an integer literal of hundreds of digits
        f = math.nan
    if not math.isfinite(f) or not lo <= f <= hi:
        raise bad(name, f"'{name}' must be a number in [{lo:g}, {hi:g}], got {shown(v)}")
    return f


def integer(body: Mapping, name: str, lo: int, default: int | None, hi: int = 2**63 - 1) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(name, f"'{name}' must be an integer in [{lo}, {hi}], got {shown(v)}")
    return v


def shown(v, limit: int = 60) -> str:
    """A client's value in an error message, cut short (a 4,000-digit number stays out of the log)."""
    try:
        text = repr(v)
    except (RecursionError, ValueError):  # deeply nested, or an integer too long to print
        return f"a {type(v).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def utf8(text: str, where: str) -> str:
    """JSON can carry lone UTF-16 surrogates ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(where, f"'{where}' is not valid Unicode text (a lone surrogate)") from None
    return text


def flag(body: Mapping, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"'{name}' must be a boolean, got {v!r}")
    return v
