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
    assert ok == 200 and card == {"id": "adaserve", "object": "model", "created": 0, "owned_by": "adaserve",
                                  "root": "adaserve"}
    assert missing == 404 and error["error"]["type"] == "not_found_error" and error["error"]["param"] == "model"


def test_with_usage_streamed_every_content_chunk_says_usage_null_and_the_last_holds_the_counts():
    body = {"prompt": "Hi", "max_tokens": 4, "stream": True}
    with_usage = {**body, "stream_options": {"include_usage": True}}
    [(_, plain), (_, counted)] = answers([("POST", "/v1/completions", body), ("POST", "/v1/completions", with_usage)])
    assert all("usage" not in e for e in plain)
    assert all(e["usage"] is None for e in counted[:-1]) and counted[-1]["choices"] == []
    usage = counted[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_usage_says_how_many_prompt_tokens_the_prefix_cache_served():
    class CachedBackend(RecordingBackend):
        async def stream(self, gen, prompt):
            yield "Hi", {"num_input_tokens": 40, "num_cached_tokens": 32}
            yield "", {"num_output_tokens": 2, "finish_reason": "length"}

    frontend = Frontend(CachedBackend(), "adaserve", lambda messages: "")

    async def main():
        async with TestClient(TestServer(frontend.app())) as client:
            resp = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            return await resp.json()

    usage = asyncio.run(main())["usage"]
    assert usage["prompt_tokens"] == 40 and usage["prompt_tokens_details"] == {"cached_tokens": 32}


def test_predicted_outputs_report_accepted_and_rejected_tokens_as_openai():
    class PredictingBackend(RecordingBackend):
        async def stream(self, gen, prompt):
            assert gen.prediction == "abc"
            yield "Hi", {"num_input_tokens": 4}
            yield "", {"num_output_tokens": 5, "finish_reason": "stop", "accepted_prediction_tokens": 3,
                       "rejected_prediction_tokens": 1}

    frontend = Frontend(PredictingBackend(), "adaserve", lambda messages: "")

    async def main():
        async with TestClient(TestServer(frontend.app())) as client:
            resp = await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "prediction": {"type": "content", "content": "abc"}})
            return await resp.json()

    usage = asyncio.run(main())["usage"]
    assert usage["completion_tokens_details"] == {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1}
