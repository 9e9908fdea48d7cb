"""The OpenAI-compatible frontend against a real tritonserver, driven by the official `openai` client."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import openai
import pytest

from harness.servers import openai_frontend

from .conftest import free_ports
from .test_triton_server import generate

pytestmark = pytest.mark.slow

PROMPT = "The three primary colors are"
MODEL = "adaserve"


def assert_same_start(text: str, other: str, chars: int = 16) -> None:
    """Two separate greedy generations of one prompt agree on their start. Not compared whole: the
    served target is bfloat16, where a run that verifies a tree and one that decodes plainly round
    differently and a later near-tie may flip (a clean-clone CI run: "...the Banana." against "...the
    Banana, but I'm"); a missing chat template or a wrong prompt would differ from the first words."""
    common = len(os.path.commonprefix([text, other]))
    assert common >= min(chars, len(text), len(other)), f"{text!r} and {other!r} part after {common} characters"


@pytest.fixture(scope="module")
def frontend(triton_server, tmp_path_factory):
    (port,) = free_ports(1)
    proc = openai_frontend(triton_server.grpc_url, port, tmp_path_factory.mktemp("openai") / "frontend.log", MODEL)
    proc.start(timeout_s=180)
    try:
        yield f"http://localhost:{port}"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client(frontend):
    return openai.OpenAI(base_url=frontend + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_models_and_health(frontend, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert urllib.request.urlopen(frontend + "/health").status == 200


def test_greedy_completion_equals_the_grpc_path_streaming_or_not(triton_server, client):
    grpc_text = "".join(generate(triton_server, PROMPT, 24, stream=True)[0])
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    assert_same_start(whole.choices[0].text, grpc_text)
    assert whole.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert_same_start("".join(c.choices[0].text for c in chunks if c.choices), grpc_text)
    assert chunks[-1].choices == [] and 1 <= chunks[-1].usage.completion_tokens <= 24
    assert whole.usage.prompt_tokens == 5
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens


def test_ignore_eos_gives_exactly_max_tokens(client):
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 12 and out.choices[0].finish_reason == "length"


def test_chat_uses_the_chat_template_streaming_or_not(triton_server, client):
    messages = [{"role": "user", "content": "Name a fruit."}]
    grpc_text = "".join(generate(triton_server, "Name a fruit.", 16, stream=True, chat=True)[0])
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    assert_same_start(whole.choices[0].message.content, grpc_text)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert_same_start("".join(c.choices[0].delta.content or "" for c in chunks), grpc_text)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_a_long_chat_without_a_length_gets_what_the_context_leaves_not_a_400(client):
    """The 512-token chat default counted against the 2,048-token context refused every prompt past
    1,536 tokens; the default shrinks to what is left instead (as OpenAI and vLLM)."""
    long = " ".join(["apple"] * 1900)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}], temperature=0)
    assert out.usage.prompt_tokens > 1536
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= 2048


def test_n_choices_sample_apart_and_count_the_prompt_once(client):
    # Not asserted: that a seed reproduces the choices. Each output token is one draw from the seeded
    # generator, but in bf16 the logits move in their last bits with the batch's shape (which trees, which
    # other requests), and that can tip a draw.
    one = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0)
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, n=3,
                                    seed=7)
    assert [c.index for c in out.choices] == [0, 1, 2] and len({c.text for c in out.choices}) > 1
    assert out.usage.prompt_tokens == one.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                                 max_tokens=6, temperature=0, stream=True))
    ends = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(c.index for c in ends) == [0, 1]


def test_a_batch_of_prompts_answers_each_as_alone(client):
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0) for p in (PROMPT, "Hi")]
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "Hi"], max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    for got, one in zip(batch.choices, alone):
        assert_same_start(got.text, one.choices[0].text)
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)


IDENTICAL_QUESTION = "What is machine learning? " + " ".join(
    f"Point {i}: say how it relates to statistics, data and computing." for i in range(20))


def test_identical_greedy_requests_give_identical_text_alone_or_in_a_burst(client):
    """The same greedy chat, alone on an idle server, again (the suffix index now holds its answer, so
    long copied chains are verified), and inside a burst whose other requests are decoding when it arrives
    (its prompt, ~300 tokens, then prefills in chunks cut by their TPOT targets): one text, whole. A
    token's logits do not depend on its batch, its tree or its prefill chunks (models/kernel_choice.py)."""
    import concurrent.futures

    def ask(question: str, max_tokens: int = 96) -> str:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                             max_tokens=max_tokens, temperature=0)
        return out.choices[0].message.content

    first = ask(IDENTICAL_QUESTION)
    assert ask(IDENTICAL_QUESTION) == first
    others = ["Write a poem about the sea.", "Explain how a CPU cache works.", "List ten fruits.",
              "Tell me a story about a dragon.", "Describe photosynthesis step by step."]
    with concurrent.futures.ThreadPoolExecutor(len(others) + 1) as pool:
        busy = [pool.submit(ask, q, 160) for q in others]
        time.sleep(1.0)  # the others are past their prefill and decoding
        again = pool.submit(ask, IDENTICAL_QUESTION)
        assert again.result() == first
        assert all(b.result() for b in busy)


def test_logprobs_echo_and_token_id_prompts_through_the_real_server(client):
    """Chat logprobs with alternatives (the chosen greedy token the likeliest); the same greedy request's
    logprobs again, after the suffix index learned its answer (verified as a long copied chain): the same
    numbers; a token-id prompt is served (echoed as its text); echo + logprobs + max_tokens 0 scores the
    prompt alone."""
    def chat():
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a color."}],
                                              max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)

    first, again = chat(), chat()
    content = first.choices[0].logprobs.content
    assert "".join(c.token for c in content) == first.choices[0].message.content
    assert len(content) == first.usage.completion_tokens and all(c.logprob <= 0 for c in content)
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)
    assert [c.logprob for c in again.choices[0].logprobs.content] == [c.logprob for c in content]
    ids = client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=1, temperature=0, echo=True)
    assert ids.usage.prompt_tokens == 2 and ids.choices[0].text  # the ids' text, then one token
    scored = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == PROMPT and scored.usage.completion_tokens == 0
    assert len(lp.tokens) == scored.usage.prompt_tokens and lp.token_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])


def test_a_seeded_sampled_request_gives_the_same_text_again_though_speculation_differs(client):
    """Temperature 1, one seed, sent twice: the second run verifies the suffix index's copy of the first
    answer in long chains, yet each emitted token is one draw from the request's own generator over the
    same logits (one kernel at every row count), so the text is the same."""
    def ask():
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=48, temperature=1.0,
                                         seed=1234).choices[0].text

    first = ask()
    assert ask() == first and first


def test_stop_strings_end_the_text_before_them(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    # An early word: two bf16 greedy runs are trusted to agree only on their start (assert_same_start);
    # a later word made the test flaky (a clean-clone run diverged first and ended by length).
    stop = full.split()[1]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert out.choices[0].finish_reason == "stop" and stop not in out.choices[0].text
    assert full.startswith(out.choices[0].text)


def test_slo_fields_in_the_body_and_as_headers(frontend, client):
    body = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0,
                                     extra_body={"tpot_slo_ms": 500, "slo_class": "chat"})
    headed = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0,
                                       extra_headers={"x-slo-tpot-ms": "500"})
    assert body.choices[0].text == headed.choices[0].text
    req = urllib.request.Request(frontend + "/v1/completions",
                                 data=json.dumps({"model": MODEL, "prompt": "Hi", "tpot_slo_ms": 50}).encode(),
                                 headers={"x-slo-tpot-ms": "60", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "x-slo-tpot-ms" in json.loads(e.value.read())["error"]["message"]


def test_ttft_targets_are_accepted_and_an_unmeetable_one_is_a_503_with_retry_after(frontend, client):
    body = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0,
                                     extra_body={"ttft_slo_ms": 60000})
    headed = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0,
                                       extra_headers={"x-slo-ttft-ms": "60000"})
    assert body.choices[0].text == headed.choices[0].text
    for stream in (False, True):
        req = urllib.request.Request(frontend + "/v1/completions",
                                     headers={"x-slo-ttft-ms": "1", "Content-Type": "application/json"},
                                     data=json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 4,
                                                      "stream": stream}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        error = json.loads(e.value.read())["error"]
        assert e.value.code == 503 and e.value.headers["Retry-After"] and error["type"] == "server_overloaded"
        assert error["message"].startswith("server cannot meet ttft_slo_ms=1 at the current load")


@pytest.mark.parametrize("kwargs, words", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 65}, "'n'"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt": [1, 10**6]}, "prompt token ids"),
    ({"extra_body": {"slo_class": "platinum"}}, "platinum"),
    ({"extra_body": {"tpot_slo_ms": -1}}, "tpot_slo_ms"),
    ({"prompt": "word " * 3000}, "prompt"),
])
def test_bad_input_is_a_400_with_a_clear_message_and_the_server_keeps_serving(client, kwargs, words):
    args = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0, **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args)
    assert words in str(e.value)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens >= 1


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)


def test_a_client_that_disconnects_frees_the_request(triton_server, frontend):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 500, "temperature": 0, "stream": True, "ignore_eos": True}
    url = urlparse(frontend)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data:")  # streaming has begun
    deadline = time.monotonic() + 10  # gauges are published every FLUSH_S (triton/metrics.py)
    while triton_server.metric("adaserve_running_requests") < 1:
        assert time.monotonic() < deadline, "a streaming request should be running"
        time.sleep(0.1)
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 60
    while triton_server.metric("adaserve_running_requests") > 0 or triton_server.metric("adaserve_kv_blocks_used") > 0:
        assert time.monotonic() < deadline, "the disconnected request still holds KV blocks"
        time.sleep(0.2)


def test_the_frontend_process_starts_and_answers(tmp_path):
    """The module entry point parses its arguments (a server it cannot reach is simply not ready)."""
    out = subprocess.run([sys.executable, "-m", "adaserve_backend.openai_frontend", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--triton-url" in out.stdout


def test_hostile_requests_against_the_real_server_get_4xx_json_and_it_keeps_serving(frontend, client):
    """Every hostile case of tests/unit/test_openai_hostile.py, against tritonserver itself: a 2xx or
    a 4xx JSON error each, none hangs, and a normal request is served after them."""
    from tests.unit.test_openai_hostile import CASES

    url = urlparse(frontend)
    for name, (method, path, body, headers) in CASES:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read()
        except (ConnectionError, http.client.HTTPException) as e:  # a body over the limit may be cut off
            assert name == "body over the limit", f"{name}: {e!r}"
            continue
        finally:
            conn.close()
        # 503: a valid request whose target this server cannot meet (e.g. "5" ms to the first token)
        error = json.loads(text)["error"] if resp.status >= 400 else None
        overloaded = resp.status == 503 and error["type"] == "server_overloaded"
        assert resp.status < 500 or overloaded, f"{name}: {resp.status} {text[:300]!r}"
        assert error is None or error["message"], name
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert out.choices[0].text


def test_structured_output_and_tool_calls_through_the_real_server(client):
    """The official client's parse() with a pydantic model; json_object streamed; a completion held to a
    choice; a forced tool call comes back as tool_calls, whole and streamed; a grammar that does not
    compile is a 400 naming response_format, and the server keeps serving."""
    import pydantic

    class City(pydantic.BaseModel):
        name: str
        country: str
        population: int

    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    parsed = client.beta.chat.completions.parse(model=MODEL, messages=ask, response_format=City, max_tokens=200,
                                                temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, City)
    stream = client.chat.completions.create(model=MODEL, messages=ask, response_format={"type": "json_object"},
                                            max_tokens=200, temperature=0.8, seed=3, stream=True)
    assert isinstance(json.loads("".join(c.choices[0].delta.content or "" for c in stream if c.choices)), dict)
    choice = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer yes or no:", max_tokens=8,
                                       temperature=0, extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].text in ("yes", "no")
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    call = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}],
                                          tools=[weather], tool_choice="required", max_tokens=100, temperature=0)
    assert call.choices[0].finish_reason == "tool_calls"
    made = call.choices[0].message.tool_calls[0]
    assert made.function.name == "get_weather" and "city" in json.loads(made.function.arguments)
    deltas = [c.choices[0] for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=100, temperature=0,
        stream=True) if c.choices]
    streamed = [tc for d in deltas if d.delta.tool_calls for tc in d.delta.tool_calls]
    assert streamed[0].function.name == "get_weather" and deltas[-1].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=8, extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}})
    assert "grammar" in str(e.value) or "schema" in str(e.value)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens
