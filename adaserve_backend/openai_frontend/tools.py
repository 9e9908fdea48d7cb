"""Tool calls (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`, `tool` messages and assistant
`tool_calls` in the history) for a model whose chat template knows no tools, as SmolLM2's does not.

The format (docs/structured-output.md#tools): the tools are described in a system message, and the model
calls them by answering with one JSON object, {"tool_calls": [{"name": ..., "arguments": {...}}]}. Earlier
calls in the history are rendered in that form, tool results as messages of role `tool`. `required` and a
named function are enforced by a grammar built from the tools' own JSON schemas; under `auto` the
grammar (if `response_format` asks for one) allows either a call or the requested answer, so tools and
structured output compose. Pure: tested without a server.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ..grammar.spec import JSON, GrammarSpec
from .field_readers import bad, shown

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's function names
FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict


@dataclass(frozen=True)
class ToolUse:
    tools: tuple[Tool, ...]
    choice: str  # "auto", "required", or a function's name ("none" never makes a ToolUse)
    parallel: bool = True

    @property
    def forced(self) -> bool:
        """The answer must be tool calls."""
        return self.choice != "auto"

    def call_schema(self) -> dict:
        """What an answer of tool calls is: each call one of the allowed tools with its arguments."""
        allowed = [t for t in self.tools if self.choice in ("auto", "required", t.name)]
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                           "required": ["name", "arguments"], "additionalProperties": False} for t in allowed]}
        calls = {"type": "array", "items": call, "minItems": 1}
        if not self.parallel or self.choice not in ("auto", "required"):
            calls["maxItems"] = 1
        return {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                "additionalProperties": False}


def tool_use(body: Mapping) -> ToolUse | None:
    """The body's tools and how they may be used (None: no tools, or tool_choice none)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", "'tool_choice' needs 'tools'")
        return None
    if not isinstance(raw, list):
        raise bad("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}")
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise bad("tools", "every tool needs a name of its own")
    if choice is None or choice in ("auto", "required", "none"):
        choice = choice or "auto"
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and isinstance(choice["function"].get("name"), str)):
        choice = choice["function"]["name"]
        if choice not in names:
            raise bad("tool_choice", f"'tool_choice' names {shown(choice)}, which is not among the tools")
    else:
        raise bad("tool_choice", "'tool_choice' must be none, auto, required or "
                  "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    return None if choice == "none" else ToolUse(tools, choice, parallel)


def _tool(i: int, raw) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(raw.get("function"), dict):
        raise bad(where, f"'{where}' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    f = raw["function"]
    if not isinstance(f.get("name"), str) or not NAME.match(f["name"]):
        raise bad(f"{where}.function.name", "a function's name is 1-64 letters, digits, underscores or dashes")
    params = f.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise bad(f"{where}.function.parameters", "a function's parameters are a JSON schema (an object)")
    description = f.get("description", "")
    if not isinstance(description, str):
        raise bad(f"{where}.function.description", "a function's description is a string")
    return Tool(f["name"], description, params)


def with_tools(use: ToolUse, answer: GrammarSpec | None) -> GrammarSpec | None:
    """The grammar of a request with tools: only calls when they are forced; under auto, a call or the
    answer `response_format` asked for (no grammar if it asked for none: the model writes freely)."""
    calls = use.call_schema()
    if use.forced:
        return GrammarSpec.schema(calls)
    if answer is None:
        return None
    if answer.kind == JSON:  # a call is a JSON object already
        return answer
    if answer.kind != "json_schema":
        raise bad("response_format", "tools compose with a JSON response_format only")
    return GrammarSpec.schema({"anyOf": [calls, json.loads(answer.guide)]})


def tool_messages(messages: tuple[dict, ...], use: ToolUse | None) -> list[dict]:
    """The history as the chat template reads it: the tools in a system message, assistant calls as
    their JSON, tool results under role `tool`."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}
                     for c in m["tool_calls"]]
            content = ((m.get("content") or "") + "\n" if m.get("content") else "") + json.dumps({"tool_calls": calls})
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if use is not None:
        listed = json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters}
                             for t in use.tools])
        how = ("You must call " + ("a tool" if use.choice == "required" else f"the tool {use.choice}")
               if use.forced else "You may call tools")
        system = (f"{how}. Tools: {listed}. To call tools, answer with only a JSON object "
                  '{"tool_calls": [{"name": <tool name>, "arguments": <arguments object>}]}.')
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def parse_calls(text: str, use: ToolUse) -> list[dict] | None:
    """The answer's tool calls in OpenAI's shape, or None where it is not a call (auto: text)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not (isinstance(doc, dict) and set(doc) == {"tool_calls"} and isinstance(doc["tool_calls"], list)):
        return None
    names = {t.name for t in use.tools}
    calls = [c for c in doc["tool_calls"] if isinstance(c, dict) and c.get("name") in names]
    if not calls:
        return None
    return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}} for c in calls]
