"""`GET /v1/models/{id}` and a usage-streaming request's chunks, as OpenAI's own API answers them."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.openai_frontend.http_app import Frontend
from tests.unit.test_openai_tenants import RecordingBackend


def answers(requests: list[tuple[str, str, dict | None]]) -> list[tuple[int, object]]:
    frontend = Frontend(RecordingBackend(), "adaserve", lambda messages: "")

    async def main():
        out = []
        async with TestClient(TestServer(frontend.app())) as client:
            for method, path, body in requests:
                resp = await client.request(method, path, json=body)
                text = await resp.text()
                events = [json.loads(line[5:]) for line in text.splitlines()
                          if line.startswith("data:") and line != "data: [DONE]"]
                out.append((resp.status, events if body and body.get("stream") else json.loads(text)))
        return out

    return asyncio.run(main())


def test_a_model_is_looked_up_by_id_and_any_other_is_openais_404():
    (ok, card), (missing, error) = answers([("GET", "/v1/models/adaserve", None), ("GET", "/v1/models/gpt-4o", None)])
    assert ok == 200 and card == {"id": "adaserve", "object": "model", "created": 0, "owned_by": "adaserve"}
    assert missing == 404 and error["error"]["type"] == "not_found_error" and error["error"]["param"] == "model"


def test_with_usage_streamed_every_content_chunk_says_usage_null_and_the_last_holds_the_counts():
    body = {"prompt": "Hi", "max_tokens": 4, "stream": True}
    with_usage = {**body, "stream_options": {"include_usage": True}}
    [(_, plain), (_, counted)] = answers([("POST", "/v1/completions", body), ("POST", "/v1/completions", with_usage)])
    assert all("usage" not in e for e in plain)
    assert all(e["usage"] is None for e in counted[:-1]) and counted[-1]["choices"] == []
    usage = counted[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
