"""OpenAI's `n` through the real aiohttp frontend: every choice its own generation with its own seed, the
responses merged as they come, the prompt counted once, and a failure or a client that leaves ending
every choice's generation (closing a backend stream is what aborts a request in the engine)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging

from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.openai_frontend.backends import BackendError
from adaserve_backend.openai_frontend.drain import Drain
from adaserve_backend.openai_frontend.http_app import Frontend
from adaserve_backend.serving.errors import ErrorKind
from tests.openai_backends import NO_CACHE, StandInBackend


class SeededBackend(StandInBackend):
    """A backend whose output depends on the seed only: `words` words "s<seed>w<i>", one per response,
    each after `delay_s` (`tagged`: after the prompt's first word); a seed in `failing` fails after its
    first word. Closing takes `closing_s` times 1 + the seed, as closing a gRPC stream takes a round trip."""

    def __init__(self, words: int = 3, delay_s: float = 0.0, failing: tuple[int, ...] = (), tagged=False,
                 closing_s: float = 0.0) -> None:
        self.words, self.delay_s, self.failing, self.tagged = words, delay_s, failing, tagged
        self.closing_s = closing_s
        self.seeds: list[int | None] = []
        self.open = 0  # streams started and not yet closed

    async def stream(self, gen, prompt):
        self.seeds.append(gen.seed)
        self.open += 1
        try:
            for i in range(self.words):
                await asyncio.sleep(self.delay_s)
                if i == 1 and gen.seed in self.failing:
                    raise BackendError("the engine failed this one", ErrorKind.INTERNAL)
                extra = {"num_input_tokens": len(prompt.split())} if i == 0 else {}
                yield (prompt.split()[0] if self.tagged else "") + f"s{gen.seed}w{i} ", extra
            yield "", {"num_output_tokens": self.words + (gen.seed or 0) % 2, "finish_reason": "length"}
        finally:
            if self.closing_s:
                await asyncio.sleep(self.closing_s * (1 + (gen.seed or 0)))
            self.open -= 1


def run(backend, requests):
    """Each (path, body) -> (status, JSON or the SSE events' data), with the frontend's in-flight count after."""

    async def main():
        frontend = Frontend(backend, "adaserve", lambda messages: messages[-1]["content"])
        async with TestClient(TestServer(frontend.app())) as client:
            out = []
            for path, body in requests:
                resp = await client.post(path, json=body)
                text = await resp.text()
                if body.get("stream"):
                    out.append((resp.status, [line[6:] for line in text.splitlines() if line.startswith("data: ")]))
                else:
                    out.append((resp.status, json.loads(text)))
            return out, frontend.in_flight

    return asyncio.run(main())


def test_n_choices_each_sample_with_their_own_seed_and_share_one_prompt_count():
    backend = SeededBackend()
    [(status, body)], in_flight = run(backend, [("/v1/completions", {"prompt": "a b c", "n": 3, "seed": 10})])
    assert status == 200 and in_flight == 0 and sorted(backend.seeds) == [10, 11, 12]
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (i, f"s{10 + i}w0 s{10 + i}w1 s{10 + i}w2 ", "length") for i in range(3)]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3 + 4 + 3, "total_tokens": 13, **NO_CACHE}


def test_a_batch_of_prompts_gives_n_choices_of_each_in_order():
    backend = SeededBackend(words=1, tagged=True)
    body = {"prompt": ["a b", "c d e"], "n": 2, "seed": 3, "max_tokens": 4}
    [(status, out)], in_flight = run(backend, [("/v1/completions", body)])
    assert status == 200 and in_flight == 0
    assert [(c["index"], c["text"]) for c in out["choices"]] == [(0, "as3w0 "), (1, "as4w0 "), (2, "cs3w0 "),
                                                                (3, "cs4w0 ")]
    assert out["usage"] == {"prompt_tokens": 2 + 3, "completion_tokens": 1 + 2 + 1 + 2, "total_tokens": 11, **NO_CACHE}


def test_streamed_choices_interleave_each_named_by_index_with_its_own_role_and_finish():
    backend = SeededBackend(delay_s=0.01)
    body = {"messages": [{"role": "user", "content": "hi there"}], "n": 2, "seed": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    [(status, events)], _ = run(backend, [("/v1/chat/completions", body)])
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 7,
                                                         "total_tokens": 9, **NO_CACHE}
    order = [c["choices"][0]["index"] for c in chunks]
    assert order.index(1) < len(order) - order[::-1].index(0) - 1  # merged as they came, not one after the other
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant" and all("role" not in m["delta"] for m in mine[1:])
        assert "".join(m["delta"].get("content", "") for m in mine) == f"s{i}w0 s{i}w1 s{i}w2 "
        assert [m["finish_reason"] for m in mine] == [None] * (len(mine) - 1) + ["length"]


def test_one_choice_failing_fails_the_request_and_ends_the_others():
    backend = SeededBackend(words=50, delay_s=0.01, failing=(6,))
    [(status, body), (ok, _)], in_flight = run(backend, [
        ("/v1/completions", {"prompt": "x", "n": 3, "seed": 5}),
        ("/v1/completions", {"prompt": "x", "n": 1, "seed": 1, "max_tokens": 2})])
    assert status == 500 and body["error"]["type"] == "internal_error" and ok == 200
    assert backend.open == 0 and in_flight == 0  # every choice's stream closed: their requests aborted
    [(status, events)], _ = run(backend, [("/v1/completions", {"prompt": "x", "n": 2, "seed": 5, "stream": True})])
    assert status == 200 and "the engine failed this one" in events[-2] and events[-1] == "[DONE]"
    assert backend.open == 0


def test_a_client_that_leaves_ends_every_choice():
    backend = SeededBackend(words=10_000, delay_s=0.005)

    async def main():
        frontend = Frontend(backend, "adaserve", lambda messages: messages[-1]["content"])
        async with TestClient(TestServer(frontend.app())) as client:
            resp = await client.post("/v1/completions", json={"prompt": "x", "n": 4, "stream": True})
            await resp.content.readline()
            assert backend.open == 4 and frontend.in_flight == 4
            resp.close()
            for _ in range(500):
                if backend.open == 0 and frontend.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            return backend.open, frontend.in_flight

    assert asyncio.run(main()) == (0, 0)


def test_n_beyond_the_frontends_in_flight_room_is_answered_at_once():
    async def main():
        frontend = Frontend(SeededBackend(), "adaserve", lambda m: m, max_in_flight=4)
        async with TestClient(TestServer(frontend.app())) as client:
            never = await client.post("/v1/completions", json={"prompt": "x", "n": 5})
            fits = await client.post("/v1/completions", json={"prompt": "x", "n": 4})
            frontend.in_flight = 1  # another request's generation
            full = await client.post("/v1/completions", json={"prompt": "x", "n": 4})
            return never.status, (await never.json())["error"]["param"], fits.status, full.status, \
                full.headers.get("Retry-After")

    assert asyncio.run(main()) == (400, "n", 200, 503, "1")


def test_a_drain_whose_grace_runs_out_ends_every_choice_once(caplog):
    """Each choice's wait is cut at once: one error event, every stream closed, no error left unread."""
    backend = SeededBackend(words=10_000, delay_s=0.005, closing_s=0.05)

    async def main():
        frontend = Frontend(backend, "adaserve", lambda messages: messages[-1]["content"])
        frontend.drain = Drain(0.2)
        async with TestClient(TestServer(frontend.app())) as client:
            resp = await client.post("/v1/completions", json={"prompt": "x", "n": 3, "seed": 0, "stream": True})
            await resp.content.readline()
            frontend.drain.signalled()
            await asyncio.wait_for(frontend.drain.wait_out(lambda: frontend.in_flight), 5)
            events = [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]
            for _ in range(500):  # the handler closes the streams after the response's end
                if backend.open == 0 and frontend.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            return events, frontend.in_flight

    with caplog.at_level(logging.DEBUG):
        events, in_flight = asyncio.run(main())
        gc.collect()
    assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]
    assert sum("shutting down" in e for e in events) == 1 and backend.open == 0 and in_flight == 0
    # the choices still closing when the first one's error ended the request were waited for, not closed
    # while running (RuntimeError), and their errors were read (else asyncio reports them, at collection)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


class RankedBackend(SeededBackend):
    """Each seed's one token with log-probability -seed / 10: the lower the seed, the likelier."""

    async def stream(self, gen, prompt):
        assert gen.logprobs == 0  # asked internally, to rank the candidates
        self.seeds.append(gen.seed)
        lp = {"ids": [gen.seed], "logprobs": [-gen.seed / 10], "top": [], "top_ids": []}
        yield f"s{gen.seed}", {"num_input_tokens": 2, "logprobs": lp}
        yield "", {"num_output_tokens": 1, "finish_reason": "length"}


def test_best_of_makes_that_many_candidates_and_returns_the_n_likeliest():
    backend = RankedBackend()
    [(status, body)], in_flight = run(backend, [("/v1/completions", {"prompt": "a b", "n": 2, "best_of": 5,
                                                                      "seed": 13, "temperature": 1.0})])
    assert status == 200 and in_flight == 0 and sorted(backend.seeds) == [13, 14, 15, 16, 17]
    assert [c["text"] for c in body["choices"]] == ["s13", "s14"] and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["logprobs"] is None  # not asked by the client
    assert body["usage"]["completion_tokens"] == 5  # every candidate counts, as OpenAI bills them
