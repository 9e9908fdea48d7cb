"""The OpenAI frontend against hostile and malformed requests: every answer is a 2xx, or a 4xx in
OpenAI's JSON error shape, never a 500 and never a hang, and the frontend then serves a normal request.

The frontend is the real aiohttp application; behind it, in place of tritonserver, the ensemble's
inputs go through tritonclient's own serialization and the scheduler model's own parser
(triton/protocol.parse_request, with the served tokenizer): what passes both is answered with a short
completion, what either refuses comes back as INVALID_ARGUMENT, as the real ensemble answers it.
tests/integration/test_openai_frontend.py runs a sample of these against a real server."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.openai_frontend.http_app import MAX_BODY_BYTES, Frontend
from adaserve_backend.openai_frontend.triton_backend import TritonBackend
from adaserve_backend.serving.errors import ErrorKind
from adaserve_backend.triton.grpc_client import EnsembleError, infer_inputs
from adaserve_backend.triton.protocol import parse_request
from adaserve_backend.triton.repository import load_repository_tokenizer

NUMBERS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens", "tpot_slo_ms", "ttft_slo_ms",
           "max_completion_tokens")
STRINGS = ("prompt", "model", "slo_class", "stop", "user")
KEY = "sk-test"


class FakeEnsemble:
    """The ensemble's contract without tritonserver: tensors serialized as tritonclient does, parsed as
    the scheduler model does."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def input_names(self) -> set[str]:
        return {"text_input", "max_tokens", "ttft_slo_ms", "tpot_slo_ms", "slo_class"}

    async def is_ready(self) -> bool:
        return True

    async def close(self) -> None:
        pass

    async def stream_tensors(self, tensors: dict[str, np.ndarray]):
        import tritonclient.grpc as grpcclient

        infer_inputs(grpcclient, tensors)  # raises on what the wire cannot carry
        raw = tensors.pop("text_input")  # the preprocessing model's part: text and template to ids
        tensors.pop("apply_chat_template", None)
        try:
            ids = self.tokenizer(raw[0].decode("utf-8"))["input_ids"]
            req, _ = parse_request("r", {**tensors, "input_ids": np.asarray(ids, dtype=np.int32)})
        except ValueError as e:
            raise EnsembleError(str(e), ErrorKind.INVALID_ARG) from None
        yield "Hi", {"num_input_tokens": len(req.prompt_ids)}
        yield "", {"num_output_tokens": 1, "finish_reason": "length"}


class BackendWithoutTriton(TritonBackend):
    """The Triton backend with `ensemble_cls` (FakeEnsemble's contract) in place of the gRPC client."""

    def __init__(self, tokenizer, metrics_url: str | None = None, ensemble_cls=FakeEnsemble) -> None:
        super().__init__("unused", metrics_url)
        self.tokenizer, self.ensemble_cls = tokenizer, ensemble_cls

    async def connect(self) -> None:
        self.ensemble = self.ensemble_cls(self.tokenizer)

    async def close(self) -> None:
        pass


def frontend_without_triton(tokenizer, render=lambda messages: messages[-1]["content"], api_key: str | None = None,
                            metrics_url: str | None = None, ensemble_cls=FakeEnsemble, **kwargs) -> Frontend:
    return Frontend(BackendWithoutTriton(tokenizer, metrics_url, ensemble_cls), "adaserve", render, api_key, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return load_repository_tokenizer(str(PROJECT_ROOT / "model_repository" / "preprocessing"))


def send_all(tokenizer, requests: list[tuple], api_key: str | None = None) -> list[tuple[int, dict | None, str]]:
    """(method, path, body bytes, headers) each -> (status, JSON body or None, content type), then a
    normal request, all on one server; each request must be answered within 10 s."""

    async def main():
        frontend = frontend_without_triton(tokenizer, api_key=api_key)
        async with TestClient(TestServer(frontend.app())) as client:
            out = []
            for method, path, body, headers in requests + [NORMAL]:
                resp = await asyncio.wait_for(client.request(method, path, data=body, headers=headers), 10)
                text = await asyncio.wait_for(resp.text(), 10)
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = None
                out.append((resp.status, parsed, resp.content_type))
            return out

    return asyncio.run(main())


def post(body, path="/v1/completions", headers=None, raw: bool = False) -> tuple:
    data = body if raw else json.dumps(body, allow_nan=True).encode()
    return "POST", path, data, {"Content-Type": "application/json", **(headers or {})}


NORMAL = post({"model": "adaserve", "prompt": "Hello", "max_tokens": 4}, headers={"Authorization": f"Bearer {KEY}"})
OK = {"prompt": "Hello", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def hostile_cases() -> list[tuple[str, tuple]]:
    cases = [
        ("empty body", post(b"", raw=True)),
        ("not json", post(b"{prompt: hi}", raw=True)),
        ("truncated json", post(b'{"prompt": "hi"', raw=True)),
        ("json array", post([1, 2, 3])),
        ("json string", post("hello")),
        ("json null", post(None)),
        ("bytes not utf-8", post(b'{"prompt": "\xff\xfe"}', raw=True)),
        ("unknown charset",
         ("POST", "/v1/completions", json.dumps(OK).encode(), {"Content-Type": "application/json; charset=klingon"})),
        ("latin-1 charset", ("POST", "/v1/completions", '{"prompt": "caf\u00e9"}'.encode("latin-1"),
                             {"Content-Type": "application/json; charset=latin-1"})),
        ("no content type", ("POST", "/v1/completions", json.dumps(OK).encode(), {})),
        ("deeply nested", post(b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", raw=True)),
        ("deeply nested object", post(b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, raw=True)),
        ("integer of 5000 digits", post(b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", raw=True)),
        ("body over the limit", post(b'{"prompt": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}', raw=True)),
        ("GET on completions", ("GET", "/v1/completions", None, {})),
        ("PUT on chat", ("PUT", "/v1/chat/completions", json.dumps(CHAT).encode(), {})),
        ("unknown path", ("POST", "/v1/embeddings", json.dumps(OK).encode(), {})),
        ("lone surrogate prompt", post(b'{"prompt": "\\ud800 hi", "max_tokens": 4}', raw=True)),
        ("lone surrogate chat",
         post(b'{"messages": [{"role": "user", "content": "\\udfff"}]}', path="/v1/chat/completions", raw=True)),
        ("lone surrogate chat part",
         post(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
                                          path="/v1/chat/completions", raw=True)),
        ("lone surrogate stop", post(b'{"prompt": "hi", "stop": ["\\ud800"]}', raw=True)),
        ("lone surrogate slo_class", post(b'{"prompt": "hi", "slo_class": "\\ud800"}', raw=True)),
        ("lone surrogate model", post(b'{"prompt": "hi", "model": "\\ud800"}', raw=True)),
        ("tiny temperature", post({**OK, "temperature": 1e-300})),
        ("denormal temperature", post({**OK, "temperature": 5e-324})),
        ("float32-denormal temperature", post({**OK, "temperature": 1e-40})),
        ("max_tokens over int32", post({**OK, "max_tokens": 2**32 + 3})),
        ("min_tokens over int32", post({**OK, "max_tokens": 4, "min_tokens": 2**33})),
        ("top_k over int32", post({**OK, "top_k": 2**40})),
        ("seed over uint64", post({**OK, "seed": 2**70})),
        ("too many stops", post({**OK, "stop": [str(i) for i in range(100)]})),
        ("stop too long", post({**OK, "stop": "x" * 100_000})),
        ("empty stop", post({**OK, "stop": ""})),
        ("messages empty", post({"messages": []}, path="/v1/chat/completions")),
        ("messages not a list", post({"messages": "hi"}, path="/v1/chat/completions")),
        ("message without role", post({"messages": [{"content": "hi"}]}, path="/v1/chat/completions")),
        ("message image",
         post({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                               path="/v1/chat/completions")),
        ("message tool role", post({"messages": [{"role": "tool", "content": "x"}]}, path="/v1/chat/completions")),
        ("prompt ids out of range", post({"prompt": [1, 2**40]})),
        ("prompt batch with an empty id list", post({"prompt": ["a", []]})),
        ("unknown field", post({**OK, "frobnicate": True})),
        ("n of 65", post({**OK, "n": 65})),
        ("n times a batch over the cap", post({"prompt": ["a"] * 40, "n": 2})),
        ("n of 0", post({**OK, "n": 0})),
        ("best_of over n streamed", post({**OK, "n": 2, "best_of": 4, "stream": True})),
        ("logprobs over 20", post({**OK, "logprobs": 21})),
        ("stream_options without stream", post({**OK, "stream_options": {"include_usage": True}})),
        ("both max tokens disagree", post({**CHAT, "max_completion_tokens": 3}, path="/v1/chat/completions")),
        ("a form-encoded body", ("POST", "/v1/completions", b"prompt=hi&max_tokens=4",
                                 {"Content-Type": "application/x-www-form-urlencoded"})),
        ("JSON sent as text/plain",
         ("POST", "/v1/completions", json.dumps(OK).encode(), {"Content-Type": "text/plain"})),
        ("slo header not a number", post(OK, headers={"x-slo-tpot-ms": "fast"})),
        ("slo header huge", post(OK, headers={"x-slo-tpot-ms": "9" * 400})),
        ("slo header inf", post(OK, headers={"x-slo-ttft-ms": "inf"})),
        ("slo header nan", post(OK, headers={"x-slo-ttft-ms": "nan"})),
        ("slo header and body differ", post({**OK, "tpot_slo_ms": 50}, headers={"x-slo-tpot-ms": "60"})),
        ("unknown slo class", post({**OK, "slo_class": "platinum"})),
        ("unknown model", post({**OK, "model": "gpt-9"})),
        ("model of 10k chars", post({**OK, "model": "m" * 10_000})),
    ]
    for name in NUMBERS:
        for label, value in (("400 digits", 10**400), ("1e400", math.inf), ("NaN", math.nan), ("-1", -1),
                             ("a string", "5"), ("a list", [1]), ("true", True)):
            cases.append((f"{name} {label}", post({**OK, name: value})))
    for name in STRINGS:
        for label, value in (("a number", 5), ("an object", {"a": 1}), ("a list of lists", [["x"]])):
            cases.append((f"{name} {label}", post({**OK, name: value})))
    return cases


CASES = hostile_cases()


def test_the_suite_is_large():
    assert len(CASES) >= 80


def check(results) -> None:
    *answers, normal = results
    for (name, _), (status, body, ctype) in zip(CASES, answers):
        assert status < 500, f"{name}: {status} {body}"
        if status >= 400:
            assert ctype == "application/json" and isinstance(body,
                                                              dict) and body["error"]["message"], f"{name}: {body}"
    assert normal[0] == 200 and normal[1]["choices"][0]["text"] == "Hi", normal


def test_hostile_requests_get_clear_4xx_answers_and_the_server_keeps_serving(tokenizer):
    check(send_all(tokenizer, [c for _, c in CASES]))


def test_every_answer_is_json_with_an_api_key_too(tokenizer):
    """With a key, the same requests (without it) are 401s in the same JSON shape; /health and /metrics
    stay open."""
    results = send_all(tokenizer, [c for _, c in CASES] + [
        ("GET", "/health", None, {}),
        ("GET", "/metrics", None, {}),
        ("GET", "/v1/models", None, {"Authorization": "Bearer wrong"}),
        ("GET", "/v1/models", None, {"Authorization": f"Bearer {KEY}"}),
    ], api_key=KEY)
    *answers, health, metrics, wrong, right, normal = results
    assert all(s in (401, 404, 405, 413) and b and b["error"]["message"] for s, b, _ in answers), answers
    assert health[0] == 200 and metrics[0] == 200 and wrong[0] == 401 and right[0] == 200 and normal[0] == 200


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
FIELD_VALUES = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
                | st.text(max_size=20) | st.lists(st.text(max_size=5), max_size=3) | JSON)
SCHEMA = st.fixed_dictionaries({}, optional={n: FIELD_VALUES for n in NUMBERS + STRINGS
                                             + ("stream", "ignore_eos", "messages")})


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), JSON | SCHEMA),
                       min_size=1, max_size=4))
def test_fuzzed_bodies_never_get_a_500(tokenizer, bodies):
    results = send_all(tokenizer, [post(body, path=path) for path, body in bodies])
    *answers, normal = results
    for (path, body), (status, parsed, ctype) in zip(bodies, answers):
        # a body that happens to be a valid request (e.g. only a prompt) is served: 200, no error to read
        explained = status < 400 or (ctype == "application/json" and parsed["error"]["message"])
        assert status < 500 and explained, (body, status)
    assert normal[0] == 200


@pytest.mark.parametrize("up, status", [(1, 200), (0, 503), (None, 503)])
def test_health_reports_an_engine_that_stopped_running(tokenizer, up, status):
    """Triton keeps the ensemble ready when the engine loop failed for good; its metric tells /health."""
    from aiohttp import web

    async def metrics(request):
        line = "" if up is None else f'adaserve_engine_up{{model="adaserve",version="1"}} {up}\n'
        return web.Response(text="# TYPE adaserve_engine_up gauge\n" + line)

    async def main():
        app = web.Application()
        app.add_routes([web.get("/metrics", metrics)])
        async with TestServer(app) as triton_metrics:
            frontend = frontend_without_triton(tokenizer, lambda m: "",
                                               metrics_url=str(triton_metrics.make_url("/metrics")))
            async with TestClient(TestServer(frontend.app())) as client:
                return (await client.get("/health")).status

    assert asyncio.run(main()) == status
