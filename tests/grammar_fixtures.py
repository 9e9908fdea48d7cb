"""A vocabulary for the tiny checkpoints' 320 tokens in which JSON can be spelled, its grammars, and the
oracle: constrained greedy decoding with transformers' model, one token at a time, without speculation."""

from __future__ import annotations

import functools
import itertools
import json
import string

import torch

from adaserve_backend.grammar.compiler import Grammars
from adaserve_backend.grammar.spec import GrammarSpec
from adaserve_backend.grammar.state import masked
from tests.engines import EOS
from tests.model_fixtures import hf_reference

VOCAB_SIZE = 320
PIECES = ['{', '}', '[', ']', '"', ':', ',', ' ', '\n', '{"', '":', '",', '"}', '":"', 'true', 'false', 'null',
          '"name"', '"age"', '"tags"', '"kind"', '"a"', '"b"', '"c"', '-', '.', 'e', '1', '2', '3', '0', '42', '7']
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "kind": {"enum": ["a", "b", "c"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
          "required": ["name", "age", "kind"], "additionalProperties": False}


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """Token 0-2 are special (2 is EOS); then JSON's pieces, letters and digits, then two-letter words."""
    words = list(PIECES) + [c for c in string.ascii_letters + string.digits if c not in PIECES]
    words += ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    return ("<unk>", "<s>", "</s>", *words[: VOCAB_SIZE - 3])


def grammars() -> Grammars:
    return Grammars(list(vocabulary()), VOCAB_SIZE, {EOS})


def text(ids: list[int]) -> str:
    return "".join(vocabulary()[t] for t in ids if t != EOS)


def valid(ids: list[int], schema: dict = SCHEMA) -> bool:
    """Whether the tokens spell a JSON document the schema accepts (the checks SCHEMA needs)."""
    try:
        doc = json.loads(text(ids))
    except ValueError:
        return False
    return check(doc, schema)


def check(doc, schema: dict) -> bool:
    kind = schema.get("type")
    if "enum" in schema:
        return doc in schema["enum"]
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(doc, dict) and all(k in doc for k in schema.get("required", ()))
                and (schema.get("additionalProperties", True) or set(doc) <= set(props))
                and all(check(v, props[k]) for k, v in doc.items() if k in props))
    if kind == "array":
        return (isinstance(doc, list) and len(doc) <= schema.get("maxItems", len(doc))
                and all(check(v, schema["items"]) for v in doc))
    if kind == "string":
        return isinstance(doc, str) and len(doc) <= schema.get("maxLength", len(doc))
    if kind == "integer":
        return isinstance(doc, int) and not isinstance(doc, bool)
    return True


@torch.no_grad()
def constrained_reference(path: str, prompt: list[int], spec: GrammarSpec, max_tokens: int) -> list[int]:
    """Greedy decoding under the grammar with transformers' own model: the oracle."""
    hf, state, ids, out = hf_reference(path), grammars().start(spec, max_tokens), list(prompt), []
    for _ in range(max_tokens):
        logits = hf(torch.tensor([ids])).logits[0, -1].float()
        token = int(torch.argmax(masked(logits, state.bitmask())))
        state.accept(token)
        out.append(token)
        ids.append(token)
        if token == EOS:
            break
    return out
