"""logprobs through the OpenAI frontend: how they are asked for (chat's logprobs + top_logprobs,
completions' logprobs N), and their shapes in whole responses and streamed chunks, as OpenAI's API
gives them (token, logprob, bytes, top_logprobs; tokens, token_logprobs, top_logprobs, text_offset)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.openai_frontend.field_readers import OpenAIError
from adaserve_backend.openai_frontend.http_app import Frontend
from adaserve_backend.openai_frontend.logprobs import FLOOR, Renderer
from adaserve_backend.openai_frontend.params import parse
from tests.unit.test_openai_tenants import StandInBackend

WORDS = {1: "Hel", 2: "lo", 3: "!", 4: "Hi"}


class LogprobBackend(StandInBackend):
    """Two responses of tokens [1, 2] and [3], each with its logprobs and `gen.logprobs` alternatives."""

    def __init__(self) -> None:
        self.seen = []

    async def stream(self, gen, prompt: str):
        self.seen.append(gen)
        k = gen.logprobs or 0

        def reported(ids, lps):
            return {"logprobs": {"ids": ids, "logprobs": lps, "top": [lp - j for lp in lps for j in range(k)],
                                 "top_ids": [4 - j % 4 for _ in ids for j in range(k)]}}

        asked = gen.logprobs is not None
        scored = ({"prompt_logprobs": {"ids": [4, 3], "logprobs": [-2.0], "top": [-2.0] * k, "top_ids": [3] * k}}
                  if asked and gen.echo else {})
        yield "Hello", {"num_input_tokens": 2, **scored,
                        **(reported([1, 2], [-0.5, float("-inf")]) if asked else {})}
        yield "!", {"num_output_tokens": 3, "finish_reason": "length",
                    **(reported([3], [-1.5]) if asked else {})}


def post(path: str, body: dict, renderer=Renderer(WORDS.__getitem__, lambda ids: "".join(WORDS[i] for i in ids))
         ) -> tuple[int, object]:
    frontend = Frontend(LogprobBackend(), "adaserve", lambda messages: "", logprob_renderer=renderer)

    async def main():
        async with TestClient(TestServer(frontend.app())) as client:
            resp = await client.post(path, json=body)
            text = await resp.text()
            if body.get("stream"):
                return resp.status, [json.loads(line[5:]) for line in text.splitlines()
                                     if line.startswith("data:") and line != "data: [DONE]"]
            return resp.status, json.loads(text)

    return asyncio.run(main())


def test_how_logprobs_are_asked_for():
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    assert parse(chat, "chat").logprobs is None
    assert parse({**chat, "logprobs": True}, "chat").logprobs == 0
    assert parse({**chat, "logprobs": True, "top_logprobs": 5}, "chat").logprobs == 5
    assert parse({"prompt": "Hi", "logprobs": 0}, "completions").logprobs == 0
    assert parse({"prompt": "Hi", "logprobs": 3}, "completions").logprobs == 3
    for body, endpoint, param in (({**chat, "top_logprobs": 2}, "chat", "top_logprobs"),
                                  ({**chat, "logprobs": True, "top_logprobs": 21}, "chat", "top_logprobs"),
                                  ({**chat, "logprobs": 1}, "chat", "logprobs"),
                                  ({"prompt": "Hi", "logprobs": True}, "completions", "logprobs"),
                                  ({"prompt": "Hi", "logprobs": -1}, "completions", "logprobs")):
        with pytest.raises(OpenAIError) as e:
            parse(body, endpoint)
        assert e.value.status == 400 and e.value.param == param


def test_chat_logprobs_whole_and_streamed():
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
    status, out = post("/v1/chat/completions", body)
    assert status == 200
    content = out["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hel", "lo", "!"]
    assert [c["logprob"] for c in content] == [-0.5, FLOOR, -1.5]  # -inf as OpenAI-compatible servers send it
    assert content[0]["bytes"] == list(b"Hel")
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["Hi", "!"]
    status, chunks = post("/v1/chat/completions", {**body, "stream": True})
    streamed = [c for ch in chunks for c in (ch["choices"][0]["logprobs"] or {"content": []})["content"]]
    assert [c["token"] for c in streamed] == ["Hel", "lo", "!"]
    assert chunks[-1]["choices"][0]["finish_reason"] and chunks[-1]["choices"][0]["logprobs"] is None
    plain = post("/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})[1]
    assert plain["choices"][0]["logprobs"] is None


def test_completion_logprobs_with_text_offsets():
    status, out = post("/v1/completions", {"prompt": "Hi", "max_tokens": 3, "logprobs": 1})
    lp = out["choices"][0]["logprobs"]
    assert lp["tokens"] == ["Hel", "lo", "!"] and lp["token_logprobs"] == [-0.5, FLOOR, -1.5]
    assert lp["text_offset"] == [0, 3, 5] and lp["top_logprobs"][2] == {"Hi": -1.5, "!": -1.5}  # chosen one too
    status, chunks = post("/v1/completions", {"prompt": "Hi", "max_tokens": 3, "logprobs": 0, "stream": True})
    offsets = [o for ch in chunks if ch["choices"][0]["logprobs"] for o in ch["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 3, 5]


def test_a_frontend_without_a_tokenizer_refuses_logprobs_by_name():
    status, out = post("/v1/completions", {"prompt": "Hi", "logprobs": 1}, renderer=None)
    assert status == 400 and out["error"]["param"] == "logprobs"


def test_echo_puts_the_prompt_and_its_logprobs_ahead_and_max_tokens_0_scores_it_alone():
    status, out = post("/v1/completions", {"prompt": "Hi!", "max_tokens": 3, "echo": True, "logprobs": 1})
    choice = out["choices"][0]
    assert choice["text"] == "Hi!Hello!"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Hi", "!", "Hel", "lo", "!"] and lp["text_offset"] == [0, 2, 3, 6, 8]
    assert lp["token_logprobs"][:3] == [None, -2.0, -0.5] and lp["top_logprobs"][0] is None
    status, out = post("/v1/completions", {"prompt": [4, 3], "max_tokens": 0, "echo": True, "logprobs": 0})
    choice = out["choices"][0]
    assert status == 200 and choice["text"] == "Hi!" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["Hi", "!"] and out["usage"]["completion_tokens"] == 0
    status, chunks = post("/v1/completions", {"prompt": "Hi!", "max_tokens": 0, "echo": True, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hi!"
    assert post("/v1/completions", {"prompt": "Hi", "max_tokens": 0})[0] == 400  # 0 only to score a prompt


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk():
    body = {"prompt": "Hi", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, chunks = post("/v1/completions", body)
    assert status == 200 and all(c["usage"]["prompt_tokens"] == 2 for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 3
