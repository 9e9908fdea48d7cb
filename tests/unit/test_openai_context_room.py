"""A chat that leaves its length open gets the default or what its prompt leaves of the context,
whichever is less (as OpenAI and vLLM), rather than a 400 once the prompt is long."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.openai_frontend.http_app import Frontend
from adaserve_backend.openai_frontend.params import CHAT_DEFAULT_MAX_TOKENS
from tests.unit.test_openai_tenants import RecordingBackend

CHAT = {"messages": [{"role": "user", "content": "Hello"}]}


def lengths_sent(room: int, bodies: list[tuple[str, dict]]) -> list[int]:
    backend = RecordingBackend()
    frontend = Frontend(backend, "adaserve", lambda messages: messages[-1]["content"], context_room=lambda text: room)

    async def main():
        async with TestClient(TestServer(frontend.app())) as client:
            for path, body in bodies:
                resp = await client.post(path, json=body)
                assert resp.status == 200, await resp.text()

    asyncio.run(main())
    return [g.max_tokens for g in backend.seen]


def test_an_open_chat_length_shrinks_to_what_the_context_leaves_and_a_given_one_does_not():
    sent = lengths_sent(100, [("/v1/chat/completions", CHAT),
                              ("/v1/chat/completions", {**CHAT, "max_tokens": 300}),
                              ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 300}),
                              ("/v1/completions", {"prompt": "Hello"})])
    assert sent == [100, 300, 300, 16]  # given lengths stay (the engine's 400 says what is wrong with them)


def test_with_room_to_spare_the_default_stays():
    assert lengths_sent(10_000, [("/v1/chat/completions", CHAT)]) == [CHAT_DEFAULT_MAX_TOKENS]
