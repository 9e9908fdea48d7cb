"""Structured output and tools in the OpenAI frontend, without a server: every way a client asks for a
grammar becomes one GrammarSpec (or a 400 naming the field), tools become a grammar where they are
forced and compose with response_format where not, the history renders in the documented format, and
an answer that is a call comes back as OpenAI's tool_calls, whole and streamed."""

from __future__ import annotations

import json

import pytest

from adaserve_backend.grammar.spec import EBNF, JSON, JSON_SCHEMA, REGEX, GrammarSpec
from adaserve_backend.openai_frontend.bodies import Tally
from adaserve_backend.openai_frontend.field_readers import OpenAIError
from adaserve_backend.openai_frontend.params import parse
from adaserve_backend.openai_frontend.tools import parse_calls, tool_messages
from adaserve_backend.openai_frontend.triton_backend import ensemble_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": SCHEMA}}


@pytest.mark.parametrize("extra, kind, guide", [
    ({"response_format": {"type": "json_object"}}, JSON, ""),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}},
     JSON_SCHEMA, json.dumps(SCHEMA)),
    ({"guided_json": SCHEMA}, JSON_SCHEMA, json.dumps(SCHEMA)),
    ({"guided_json": json.dumps(SCHEMA)}, JSON_SCHEMA, json.dumps(SCHEMA)),
    ({"structured_outputs": {"regex": "[0-9]+"}}, REGEX, "[0-9]+"),
    ({"guided_choice": ["yes", "no."]}, REGEX, r"(yes)|(no\.)"),
    ({"guided_grammar": 'root ::= "a"'}, EBNF, 'root ::= "a"'),
    ({"json_schema": SCHEMA}, JSON_SCHEMA, json.dumps(SCHEMA)),  # llama.cpp's
])
def test_each_way_of_asking_for_structured_output_is_one_grammar(extra, kind, guide):
    for body, endpoint in ((CHAT | extra, "chat"), ({"model": "m", "prompt": "x"} | extra, "completions")):
        gen = parse(body, endpoint)
        assert gen.grammar == GrammarSpec(kind, guide)
        tensors = ensemble_request(gen, "x", {"guided_decoding_guide_type"})
        assert tensors["guided_decoding_guide_type"][0] == kind.encode()


def test_text_asks_for_nothing_and_conflicts_or_bad_schemas_are_a_400():
    assert parse(CHAT | {"response_format": {"type": "text"}}, "chat").grammar is None
    for extra, param in [({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
                         ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
                          "response_format.json_schema.schema"),
                         ({"guided_json": "{oops"}, "guided_json"),
                         ({"guided_choice": []}, "guided_choice"),
                         ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens"),
                         ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
                         ({"tool_choice": "required"}, "tool_choice"),
                         ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                          "tool_choice")]:
        with pytest.raises(OpenAIError) as e:
            parse(CHAT | extra, "chat")
        assert e.value.status == 400 and e.value.param == param, extra
    with pytest.raises(OpenAIError):  # an older repository without the inputs: refused, never ignored
        ensemble_request(parse(CHAT | {"response_format": {"type": "json_object"}}, "chat"), "x", set())


def test_forced_tools_are_a_grammar_of_calls_and_auto_composes_with_response_format():
    required = parse(CHAT | {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}, "chat")
    schema = json.loads(required.grammar.guide)
    calls = schema["properties"]["tool_calls"]
    assert calls["maxItems"] == 1 and calls["items"]["anyOf"][0]["properties"]["arguments"] == SCHEMA
    pick = {"type": "function", "function": {"name": "get_weather"}}
    named = parse(CHAT | {"tools": [WEATHER], "tool_choice": pick}, "chat")
    assert named.tools.choice == "get_weather" and named.grammar.kind == JSON_SCHEMA
    auto = parse(CHAT | {"tools": [WEATHER]}, "chat")
    assert auto.grammar is None and auto.tools.choice == "auto"
    both = parse(CHAT | {"tools": [WEATHER], "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": {"type": "object", "properties": {"text": {"type": "string"}}}}}}, "chat")
    assert len(json.loads(both.grammar.guide)["anyOf"]) == 2
    assert parse(CHAT | {"tools": [WEATHER], "tool_choice": "none"}, "chat").tools is None


def test_the_history_renders_tools_calls_and_results_in_the_documented_format():
    body = CHAT | {"tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]}
    gen = parse(body, "chat")
    out = tool_messages(gen.messages, gen.tools)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert "get_weather" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    assert out[3] == {"role": "tool", "content": "sunny, 21 C"}


def test_an_answer_that_is_a_call_comes_back_as_tool_calls_whole_and_streamed():
    use = parse(CHAT | {"tools": [WEATHER]}, "chat").tools
    answer = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    assert parse_calls("It is sunny.", use) is None and parse_calls('{"tool_calls": [{"name": "x"}]}', use) is None
    whole = Tally("chat", "m", tools=use)
    whole.take(0, answer, {"finish_reason": "stop"})
    choice = whole.whole()["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    streamed = Tally("chat", "m", tools=use, include_usage=True)
    sent = []
    for piece in (answer[:20], answer[20:]):
        sent += streamed.chunks(streamed.take(0, piece, {}), None, 0)
    assert sent == []  # held until the answer is known to be a call
    sent = streamed.chunks(None, "stop", 0)
    deltas = sent[0]["choices"][0]["delta"]
    assert deltas["role"] == "assistant" and deltas["tool_calls"][0]["index"] == 0
    assert deltas["tool_calls"][0]["function"]["name"] == "get_weather" and sent[0]["usage"] is None
    assert sent[-1]["choices"][0]["finish_reason"] == "tool_calls"
    text = Tally("chat", "m", tools=use)
    text.take(0, "It is sunny.", {})
    sent = text.chunks(None, "stop", 0)
    assert sent[0]["choices"][0]["delta"]["content"] == "It is sunny."
    assert sent[-1]["choices"][0]["finish_reason"] == "stop"


def test_negative_seeds_a_model_card_like_vllms_and_a_template_that_refuses_is_a_400():
    assert parse({"model": "m", "prompt": "x", "seed": -1}, "completions").seed == 2**64 - 1
    from adaserve_backend.openai_frontend.http_app import Frontend
    from adaserve_backend.openai_frontend.served_prompts import chat_renderer

    card = Frontend(None, "adaserve", lambda m: "", max_model_len=2048)._model_card()
    assert card["root"] == "adaserve" and card["max_model_len"] == 2048

    class Refusing:
        chat_template = "{{ raise_exception('roles must alternate') }}"

        def apply_chat_template(self, *a, **k):
            raise ValueError("roles must alternate")

    with pytest.raises(OpenAIError) as e:
        chat_renderer(Refusing())(({"role": "user", "content": "x"},))
    assert e.value.status == 400 and "roles must alternate" in e.value.message


def test_stop_token_ids_reach_the_model_or_are_refused():
    gen = parse({"model": "m", "prompt": "x", "stop_token_ids": [7, 9]}, "completions")
    assert list(ensemble_request(gen, "x", {"stop_token_ids"})["stop_token_ids"]) == [7, 9]
    with pytest.raises(OpenAIError):
        ensemble_request(gen, "x", set())
    with pytest.raises(OpenAIError) as e:
        parse({"model": "m", "prompt": "x", "stop_token_ids": ["a"]}, "completions")
    assert e.value.param == "stop_token_ids"


def test_assistant_prefill_and_custom_roles_render_as_the_template_says():
    from adaserve_backend.openai_frontend.served_prompts import chat_prompt, chat_renderer
    from tests.unit.test_triton_protocol import tokenizer

    render = chat_renderer(tokenizer())
    body = {"model": "m", "messages": [{"role": "user", "content": "Name a fruit."},
                                       {"role": "assistant", "content": "The fruit is"}],
            "add_generation_prompt": False, "continue_final_message": True}
    text = chat_prompt(render, parse(body, "chat"))
    assert text.endswith("The fruit is") and not text.endswith("assistant\n")
    opened = chat_prompt(render, parse({**body, "add_generation_prompt": True, "continue_final_message": False},
                                       "chat"))
    assert opened.endswith("<|im_start|>assistant\n")
    custom = parse({"model": "m", "messages": [{"role": "narrator", "content": "Once upon a time"}]}, "chat")
    assert "<|im_start|>narrator\nOnce upon a time" in chat_prompt(render, custom)
