"""Chat messages in an OpenAI body: roles (developer read as system), text content (or text parts),
a tool result's call id, an assistant's earlier tool calls. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from .field_readers import bad, flag, utf8

ROLES = ("system", "developer", "user", "assistant", "tool")
CUSTOM_ROLE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")  # any other role: the chat template renders it as it can


def chat_message(i: int, m) -> dict:
    """A chat message: its role (developer read as system) and text; a tool result's call id; an
    assistant's earlier tool calls (then its content may be null)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not (
            m["role"] in ROLES or CUSTOM_ROLE.match(m["role"])):
        raise bad(where, f"{where} needs a role: system, developer, user, assistant, tool, or a name of its own "
                  "(1-32 letters, digits, _ or -)")
    role = "system" if m["role"] == "developer" else m["role"]
    out = {"role": role}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = _tool_calls(where, m["tool_calls"])
        if m.get("content") is None:
            return out | {"content": ""}
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise bad(f"{where}.tool_call_id", "a tool message needs the 'tool_call_id' it answers")
    return out | {"content": text_of(m.get("content"), f"{where}.content")}


def _tool_calls(where: str, calls) -> list[dict]:
    if not isinstance(calls, list) or not all(
            isinstance(c, dict) and c.get("type", "function") == "function" and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str) and isinstance(c["function"].get("arguments", ""), str)
            for c in calls):
        raise bad(f"{where}.tool_calls", "tool_calls are {\"id\", \"type\": \"function\", \"function\": "
                  "{\"name\", \"arguments\": a JSON string}}")
    for c in calls:
        try:
            json.loads(c["function"].get("arguments") or "{}")
        except ValueError:
            raise bad(f"{where}.tool_calls", "a tool call's arguments must be a JSON string") from None
    return [{"id": c.get("id", ""), "type": "function", "function": dict(c["function"])} for c in calls]


def text_of(content, where: str) -> str:
    if isinstance(content, str):
        return utf8(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return utf8("".join(p["text"] for p in content), where)
    raise bad(where, f"'{where}' must be a string or a list of text parts (images and audio are not supported)")


def assistant_prefill(body: Mapping, messages: tuple[dict, ...]) -> dict:
    """vLLM's add_generation_prompt and continue_final_message: the answer goes on from the last
    (assistant) message's text instead of starting a new turn."""
    opened, continued = flag(body, "add_generation_prompt", True), flag(body, "continue_final_message")
    if continued and (opened or messages[-1]["role"] != "assistant"):
        raise bad("continue_final_message", "'continue_final_message' continues a last message of role assistant, "
                  "with 'add_generation_prompt': false")
    return {"add_generation_prompt": opened, "continue_final_message": continued}
