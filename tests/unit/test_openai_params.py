"""OpenAI request bodies -> ensemble requests: every parameter mapped or refused, never ignored."""

from __future__ import annotations

import pytest

from adaserve_backend.openai_frontend.backends import BackendError, http_error
from adaserve_backend.openai_frontend.bodies import Choice, Tally, sse
from adaserve_backend.openai_frontend.choices import choice_generation
from adaserve_backend.openai_frontend.field_readers import OpenAIError
from adaserve_backend.openai_frontend.params import CHAT_DEFAULT_MAX_TOKENS, parse
from adaserve_backend.openai_frontend.triton_backend import ensemble_request
from adaserve_backend.serving.errors import ErrorKind
from adaserve_backend.slo import SLO
from tests.openai_backends import NO_CACHE


def test_completion_parameters_map_to_the_ensemble():
    g = parse({"model": "m", "prompt": "Hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "seed": 3,
               "stop": ["\n\n", "END"], "min_tokens": 2, "stream": True, "stream_options": {"include_usage": True},
               "n": 1, "logprobs": None, "user": "u1"}, "completions")
    assert (g.prompts[0], g.max_tokens, g.temperature, g.top_p, g.top_k, g.seed, g.stop,
            g.min_tokens) == ("Hi", 7, 0.5, 0.9, 20, 3, ("\n\n", "END"), 2)
    assert g.stream and g.include_usage and g.messages is None
    t = ensemble_request(g, "Hi", supported=set())
    assert t["text_input"][0] == b"Hi" and t["max_tokens"][0] == 7 and t["seed"][0] == 3 and t["top_k"][0] == 20
    assert list(t["stop_words"]) == [b"\n\n", b"END"] and t["min_tokens"][0] == 2 and not t["apply_chat_template"][0]
    assert t["temperature"][0] == pytest.approx(0.5) and t["top_p"][0] == pytest.approx(0.9)
    assert t["return_num_input_tokens"][0]
    assert g.tenant == "u1" and "tenant" not in t  # a repository without the input: nothing to scope
    # OpenAI's `user` scopes the suffix index
    assert ensemble_request(g, "Hi", supported={"tenant"})["tenant"][0] == b"u1"


def test_defaults_follow_openai():
    g = parse({"prompt": "Hi"}, "completions")
    assert g.max_tokens == 16 and g.temperature == 1.0 and not g.stream and g.stop == ()
    c = parse({"messages": [{"role": "user", "content": "Hi"}]}, "chat")
    assert c.max_tokens == CHAT_DEFAULT_MAX_TOKENS and c.messages == ({"role": "user", "content": "Hi"},)


def test_chat_messages_max_completion_tokens_and_ignore_eos():
    g = parse({"messages": [{"role": "developer", "content": "Be brief."},
                            {"role": "user",
                             "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}],
               "max_completion_tokens": 9, "ignore_eos": True}, "chat")
    assert g.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"})
    assert g.max_tokens == 9 and g.min_tokens == 9  # ignore_eos: no stop before max_tokens


def test_slo_from_body_or_headers():
    g = parse({"prompt": "x", "tpot_slo_ms": 50, "slo_class": "coding"}, "completions")
    assert g.slo == SLO(50.0, None, "coding")
    h = parse({"prompt": "x"}, "completions", {"X-SLO-TPOT-MS": "40", "x-slo-ttft-ms": "1500", "x-slo-class": "chat"})
    assert h.slo == SLO(40.0, 1500.0, "chat")
    t = ensemble_request(h, "x", supported={"ttft_slo_ms"})
    assert t["tpot_slo_ms"][0] == 40.0 and t["ttft_slo_ms"][0] == 1500.0 and t["slo_class"][0] == b"chat"
    with pytest.raises(OpenAIError, match="not supported by this server's scheduler"):
        ensemble_request(h, "x", supported=set())  # never silently dropped


def test_n_choices_and_their_seeds():
    g = parse({"prompt": "x", "n": 3, "best_of": 3, "seed": 2**64 - 2}, "completions")
    assert g.n == 3 and parse({"prompt": "x"}, "completions").n == 1
    # each choice its own seed: sampled choices differ, a seeded request is reproduced choice for choice
    assert [choice_generation(g, i).seed for i in range(3)] == [2**64 - 2, 2**64 - 1, 0]
    assert choice_generation(parse({"prompt": "x", "n": 2}, "completions"), 1).seed is None


def test_a_batch_of_prompts():
    g = parse({"prompt": ["a", "b", "c"], "n": 2}, "completions")
    assert g.prompts == ("a", "b", "c") and g.generations == 6
    assert parse({"prompt": ["a"]}, "completions").prompts == ("a",)
    chat = parse({"messages": [{"role": "user", "content": "Hi"}], "n": 64}, "chat")
    assert chat.prompts == () and chat.generations == 64


def test_what_vllm_bench_serve_sends_is_accepted():
    """Its completions payload, neutral extras included (repetition_penalty 1.0, logprobs null)."""
    body = {"model": "m", "prompt": "x", "repetition_penalty": 1.0, "max_tokens": 8, "logprobs": None, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    g = parse(body, "completions", {})
    assert g.max_tokens == 8 and g.min_tokens == 8 and g.stream and g.include_usage


@pytest.mark.parametrize("body, headers, param", [
    ({"prompt": "x", "n": 0}, {}, "n"),
    ({"prompt": "x", "n": 65}, {}, "n"),
    ({"prompt": ["x"] * 33, "n": 2}, {}, "n"),
    ({"prompt": ["x", ""]}, {}, "prompt"),
    ({"prompt": ["x", 5]}, {}, "prompt"),
    ({"prompt": []}, {}, "prompt"),
    ({"prompt": "x", "n": "2"}, {}, "n"),
    ({"prompt": "x", "n": 3, "best_of": 2}, {}, "best_of"),
    ({"prompt": "x", "n": 1, "best_of": 3, "stream": True}, {}, "best_of"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 1, "best_of": 3}, {}, "best_of"),
    ({"prompt": "x", "logprobs": 21}, {}, "logprobs"),
    ({"prompt": "x", "echo": "yes"}, {}, "echo"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": True}, {}, "echo"),
    ({"prompt": "x", "frequency_penalty": 2.5}, {}, "frequency_penalty"),
    ({"prompt": "x", "presence_penalty": "1"}, {}, "presence_penalty"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, {}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, {}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [5]}, {}, "logit_bias"),
    ({"prompt": "x", "repetition_penalty": 1.2}, {}, "repetition_penalty"),
    ({"prompt": "x", "response_format": {"type": "yaml"}}, {}, "response_format"),
    ({"prompt": "x", "max_tokens": 0}, {}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "8"}, {}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, {}, "temperature"),
    ({"prompt": "x", "temperature": True}, {}, "temperature"),
    ({"prompt": "x", "top_p": 0}, {}, "top_p"),
    ({"prompt": "x", "seed": -(2**63) - 1}, {}, "seed"),
    ({"prompt": "x", "stop": ["a", ""]}, {}, "stop"),
    ({"prompt": "x", "stop": [str(i) for i in range(17)]}, {}, "stop"),
    ({"prompt": "x", "min_tokens": 20, "max_tokens": 10}, {}, "min_tokens"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, {}, "stream_options"),
    ({"prompt": ""}, {}, "prompt"),
    ({"prompt": [1, -2, 3]}, {}, "prompt"),
    ({"prompt": [[1, 2], []]}, {}, "prompt"),
    ({"prompt": [1, True]}, {}, "prompt"),
    ({"prompt": "x", "tpot_slo_ms": -5}, {}, "tpot_slo_ms"),
    ({"prompt": "x"}, {"x-slo-tpot-ms": "fast"}, "tpot_slo_ms"),
    ({"prompt": "x", "tpot_slo_ms": 50}, {"x-slo-tpot-ms": "60"}, "tpot_slo_ms"),
    ({"prompt": "x", "slo_class": 3}, {}, "slo_class"),
    ({"prompt": "x", "user": 7}, {}, "user"),
    ({"prompt": "x", "user": ""}, {}, "user"),
    ({"prompt": "x", "user": "u" * 257}, {}, "user"),
    ({"prompt": "x", "user": "\ud800"}, {}, "user"),
    ({"messages": []}, {}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, {}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "a role with spaces", "content": "x"}]}, {}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, {}, "continue_final_message"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, {}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5", "max_completion_tokens": 6},
     {}, "max_tokens"),
    ({"prompt": "x", "logprobs": True}, {}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, {}, "tools[0]"),
])
def test_bad_or_unsupported_parameters_are_a_clear_400(body, headers, param):
    endpoint = "chat" if "messages" in body else "completions"
    with pytest.raises(OpenAIError) as e:
        parse(body, endpoint, headers)
    assert e.value.status == 400 and e.value.param == param and e.value.message
    assert e.value.body()["error"]["type"] == "invalid_request_error"


def test_backend_errors_map_by_their_kind_only():
    busy = http_error(BackendError("server cannot meet ttft_slo_ms=1 at the current load", ErrorKind.UNAVAILABLE))
    assert busy.status == 503 and busy.retry_after_s is not None and busy.kind == "server_overloaded"
    assert http_error(BackendError("max_tokens must be >= 1", ErrorKind.INVALID_ARG)).status == 400
    assert http_error(BackendError("internal error: looks like a failure", ErrorKind.INVALID_ARG)).status == 400
    assert http_error(BackendError("input 'seed' must hold exactly one value", ErrorKind.INTERNAL)).status == 500
    assert http_error(BackendError("no kind")).status == 500
    assert ErrorKind.from_grpc("RESOURCE_EXHAUSTED") is ErrorKind.UNAVAILABLE
    assert ErrorKind.from_grpc("") is ErrorKind.INTERNAL


def test_response_shapes():
    t = Tally("chat", "m", prompt_counts=[5], choices=[Choice("Hello", 2, "stop")])
    whole = t.whole()
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, **NO_CACHE}
    assert t.chunk("He")["choices"][0]["delta"] == {"role": "assistant", "content": "He"}  # a choice's first
    assert t.chunk(finish_reason="length")["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                                             "finish_reason": "length"}
    assert t.usage_chunk()["choices"] == [] and t.usage_chunk()["object"] == "chat.completion.chunk"
    c = Tally("completions", "m", choices=[Choice("abc")])
    assert c.whole()["object"] == "text_completion" and c.chunk("b")["choices"][0]["text"] == "b"
    # n choices: indexed in order, the prompt counted once, every choice's completion counted
    n = Tally("chat", "m", prompt_counts=[4], choices=[Choice("a", 1, "stop"), Choice("bc", 3, "length")])
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in n.whole()["choices"]] == [
        (0, "a", "stop"), (1, "bc", "length")]
    assert n.usage() == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8, **NO_CACHE}
    assert n.chunk("x", index=1)["choices"][0] == {"index": 1, "delta": {"role": "assistant", "content": "x"},
                                                   "logprobs": None, "finish_reason": None}
    assert Tally("chat", "m", n=3).n == 3
    # a batch of prompts: choice i reads prompt i // n, each prompt counted once
    b = Tally("completions", "m", n=2, prompts=3)
    assert len(b.choices) == 6
    for i, tokens in ((0, 4), (1, 4), (5, 7)):
        b.count_prompt(i, tokens)
    assert b.prompt_counts == [4, 0, 7] and b.prompt_tokens == 11
    assert sse({"a": "é"}) == 'data: {"a": "é"}\n\n'.encode()


def test_max_completion_tokens_wins_over_max_tokens_as_openai_deprecated_the_older():
    g = parse({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "max_completion_tokens": 9}, "chat")
    assert g.max_tokens == 9


def test_what_agent_frameworks_send_by_default_is_accepted_and_what_needs_a_capability_is_refused_by_name():
    chat = {"messages": [{"role": "user", "content": "x"}]}
    parse({**chat, "store": False, "metadata": {}}, "chat")
    for body, param, words in (({"store": True}, "store", "does not store"),
                               ({"metadata": {"user": "a"}}, "metadata", "stored completions"),
                               ({"reasoning_effort": "low"}, "reasoning_effort", "not supported with this model")):
        with pytest.raises(OpenAIError) as e:
            parse({**chat, **body}, "chat")
        assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_penalties_and_logit_bias_are_taken_as_openai_defines_them():
    gen = parse({"prompt": "x", "frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"50256": -100}},
                "completions")
    assert (gen.frequency_penalty, gen.presence_penalty, gen.logit_bias) == (0.5, -1.0, ((50256, -100.0),))


def test_predicted_outputs_are_taken_as_text_and_anything_else_refused():
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert parse({**chat, "prediction": {"type": "content", "content": "def f():"}}, "chat").prediction == "def f():"
    parts = {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert parse({**chat, "prediction": parts}, "chat").prediction == "ab"
    for bad_value in ({"type": "image", "content": "x"}, "x", {"type": "content", "content": 5}):
        with pytest.raises(OpenAIError) as e:
            parse({**chat, "prediction": bad_value}, "chat")
        assert e.value.param == "prediction"
