"""A request's body as JSON: only a body sent as JSON, only a JSON object, only what a parser takes
without harm; everything else an OpenAIError 4xx."""

from __future__ import annotations

import json

from .field_readers import OpenAIError


def check_json_type(content_type: str | None) -> None:
    """A body sent as anything but JSON is refused (415), not parsed as JSON anyway: a browser can post a
    form to any address without asking, so serving form bodies would let any page a user visits drive
    this server (what FastAPI, and so vLLM, refuse too). No Content-Type at all is taken as JSON."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise OpenAIError(415, f"the request body must be JSON (Content-Type: application/json), not {media!r}")


def read_json(raw: bytes):
    """The body as JSON, whatever Content-Type's charset claims (JSON is UTF-8: RFC 8259); OpenAIError
    400 for anything that is not a JSON object a parser can take without harm."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OpenAIError(400, "the request body is not UTF-8 text") from None
    try:  # RecursionError: nesting past the parser's depth; ValueError: an integer past Python's 4,300 digits
        body = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise OpenAIError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    return body
