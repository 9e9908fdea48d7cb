"""The hostile requests the soak sprinkles into its load: each one is invalid, so the only right answer
is a 4xx in OpenAI's error shape, and it must come while the server is busy with real traffic (the
unit suite, tests/unit/test_openai_hostile.py, sends many more to an idle frontend)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class HostileCase:
    name: str
    body: bytes | None
    method: str = "POST"
    path: str = "/v1/completions"
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


def _json(body, path: str = "/v1/completions") -> tuple[bytes, str]:
    return json.dumps(body, allow_nan=True).encode(), path


def _case(name: str, body, path: str = "/v1/completions") -> HostileCase:
    data, path = _json(body, path)
    return HostileCase(name, data, path=path)


OK = {"model": "adaserve", "prompt": "Write a haiku about rivers.", "max_tokens": 16}
CHAT = {"model": "adaserve", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}

HOSTILE_CASES: tuple[HostileCase, ...] = (
    HostileCase("malformed json", b'{"prompt": hi, "max_tokens": }'),
    HostileCase("truncated json", b'{"model": "adaserve", "prompt": "hi", "max_tok'),
    HostileCase("empty body", b""),
    HostileCase("json array", b"[1, 2, 3]"),
    HostileCase("invalid utf-8", b'{"model": "adaserve", "prompt": "\xff\xfe\xfd", "max_tokens": 4}'),
    HostileCase("lone surrogate", b'{"model": "adaserve", "prompt": "\\ud800 hi", "max_tokens": 4}'),
    _case("wrong model", {**OK, "model": "gpt-9"}),
    _case("wrong model, chat", {**CHAT, "model": "gpt-9"}, "/v1/chat/completions"),
    _case("max_tokens negative", {**OK, "max_tokens": -1}),
    _case("max_tokens a string", {**OK, "max_tokens": "16"}),
    _case("max_tokens over int32", {**OK, "max_tokens": 2**32 + 3}),
    # within the frontend's range, past the model's context: the engine refuses it before any output
    _case("huge max_tokens", {**OK, "max_tokens": INT32_MAX}),
    _case("huge max_tokens, streamed", {**OK, "max_tokens": INT32_MAX, "stream": True}),
    _case("temperature NaN", {**OK, "temperature": float("nan")}),
    _case("top_p negative", {**OK, "top_p": -0.5}),
    _case("unknown slo class", {**OK, "slo_class": "platinum"}),
    _case("n of 2", {**OK, "n": 2}),
    _case("messages empty", {**CHAT, "messages": []}, "/v1/chat/completions"),
    _case("message without role", {**CHAT, "messages": [{"content": "hi"}]}, "/v1/chat/completions"),
    HostileCase("GET on completions", None, method="GET", headers={}),
    _case("unknown path", OK, "/v1/embeddings"),
    HostileCase("body over the limit", b'{"prompt": "' + b"a" * (4 * 2**20 + 10) + b'"}'),
)
