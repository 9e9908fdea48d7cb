"""A chat that leaves its length open gets the default or what its prompt leaves of the context,
whichever is less (as OpenAI and vLLM), rather than a 400 once the prompt is long."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.openai_frontend.http_app import Frontend
from adaserve_backend.openai_frontend.params import CHAT_DEFAULT_MAX_TOKENS
from tests.unit.test_openai_tenants import RecordingBackend

CHAT = {"messages": [{"role": "user", "content": "Hello"}]}


def sent(room: int, bodies: list[tuple[str, dict]]) -> list:
    """The generations the backend was asked for, each body posted to its path."""
    backend = RecordingBackend()
    frontend = Frontend(backend, "adaserve", lambda messages: messages[-1]["content"], context_room=lambda text: room)

    async def main():
        async with TestClient(TestServer(frontend.app())) as client:
            for path, body in bodies:
                resp = await client.post(path, json=body)
                assert resp.status == 200, await resp.text()

    asyncio.run(main())
    return backend.seen


def lengths_sent(room: int, bodies: list[tuple[str, dict]]) -> list[int]:
    return [g.max_tokens for g in sent(room, bodies)]


def test_an_open_chat_length_shrinks_to_what_the_context_leaves_and_a_given_one_does_not():
    sent = lengths_sent(100, [("/v1/chat/completions", CHAT),
                              ("/v1/chat/completions", {**CHAT, "max_tokens": 300}),
                              ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 300}),
                              ("/v1/completions", {"prompt": "Hello"})])
    assert sent == [100, 300, 300, 16]  # given lengths stay (the engine's 400 says what is wrong with them)


def test_an_asked_for_min_tokens_is_never_lowered_and_ignore_eos_shrinks_with_the_length():
    bodies = [{**CHAT, "min_tokens": 50}, {**CHAT, "min_tokens": 200}, {**CHAT, "ignore_eos": True}]
    got = [(g.max_tokens, g.min_tokens) for g in sent(100, [("/v1/chat/completions", b) for b in bodies])]
    assert got == [(100, 50), (200, 200), (100, 100)]  # 200 past the room: the engine's 400


def test_with_room_to_spare_the_default_stays():
    assert lengths_sent(10_000, [("/v1/chat/completions", CHAT)]) == [CHAT_DEFAULT_MAX_TOKENS]
