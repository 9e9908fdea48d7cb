"""Structured output in an OpenAI body: `response_format` (text, json_object, json_schema with its
`strict`), and the extensions other servers' clients send: vLLM's `structured_outputs` and older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, llama.cpp's `json_schema` and
`grammar`. Each becomes one `GrammarSpec` (grammar/spec.py), or a 400 naming the field. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from ..grammar.spec import EBNF, JSON, JSON_SCHEMA, REGEX, GrammarSpec
from .field_readers import bad, shown

# vLLM's names (structured_outputs' keys, and guided_<key> before it), llama.cpp's: the grammar kind each is.
EXTENSIONS = {"json": JSON_SCHEMA, "regex": REGEX, "choice": REGEX, "grammar": EBNF}
FIELDS = ("response_format", "structured_outputs", "json_schema", "grammar",
          *(f"guided_{k}" for k in EXTENSIONS))


def grammar_of(body: Mapping) -> GrammarSpec | None:
    """The body's one grammar (None: free text); two ways of asking at once is a 400."""
    found = [(name, spec) for name in FIELDS if body.get(name) is not None
             and (spec := _read(name, body[name])) is not False]
    if len(found) > 1:
        raise bad(found[1][0], f"'{found[0][0]}' and '{found[1][0]}' both constrain the output: send one")
    return found[0][1] if found else None


def _read(name: str, value) -> GrammarSpec | None | bool:
    """False: the field asks for nothing (response_format text)."""
    try:
        if name == "response_format":
            return _response_format(value)
        if name == "structured_outputs":
            if not isinstance(value, dict) or len(set(value) & set(EXTENSIONS)) != 1 or set(value) - set(EXTENSIONS):
                raise bad(name, f"'structured_outputs' takes exactly one of {', '.join(EXTENSIONS)}")
            (key, v), = value.items()
            return _extension(f"structured_outputs.{key}", key, v)
        if name == "json_schema":  # llama.cpp: the schema itself
            return _schema(name, value)
        if name == "grammar":  # llama.cpp: GBNF, which the grammar engine reads as EBNF
            return _text_grammar(name, EBNF, value)
        return _extension(name, name.removeprefix("guided_"), value)
    except ValueError as e:  # GrammarSpec's own checks
        raise bad(name, str(e)) from None


def _response_format(value) -> GrammarSpec | bool:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                  f"or {{\"type\": \"json_schema\", \"json_schema\": {{...}}}}, got {shown(value)}")
    kind = value["type"]
    if kind == "text":
        return False
    if kind == "json_object":  # llama.cpp also takes a schema here
        return _schema("response_format.schema", value["schema"]) if value.get("schema") else GrammarSpec(JSON)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not spec or not isinstance(spec.get("name", ""), str):
        raise bad("response_format.json_schema", "'json_schema' must be an object with 'name' and 'schema'")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise bad("response_format.json_schema.strict", "'strict' must be a boolean")
    # strict or not, the output follows the schema exactly: decoding cannot leave it
    return _schema("response_format.json_schema.schema", spec.get("schema", {"type": "object"}))


def _extension(name: str, key: str, value) -> GrammarSpec:
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad(name, f"'{name}' must be a non-empty list of non-empty strings")
        return GrammarSpec(REGEX, "|".join(f"({re.escape(c)})" for c in value))
    if key == "json":
        return _schema(name, json.loads(value) if isinstance(value, str) else value)
    return _text_grammar(name, EXTENSIONS[key], value)


def _schema(name: str, schema) -> GrammarSpec:
    if not isinstance(schema, (dict, bool)):
        raise bad(name, f"'{name}' must be a JSON schema (an object), got {shown(schema)}")
    return GrammarSpec.schema(schema)


def _text_grammar(name: str, kind: str, value) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise bad(name, f"'{name}' must be a non-empty string")
    return GrammarSpec(kind, value)
