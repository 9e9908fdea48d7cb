"""What a request's grammar is, as plain data: its kind and its text. No grammar engine here, so every
front door and the request contract can name one without importing it."""

from __future__ import annotations

import json
from dataclasses import dataclass

# The kinds, under TensorRT-LLM's names for its `guided_decoding_guide_type` input (request_fields.py).
JSON = "json"  # any JSON object (OpenAI's response_format json_object)
JSON_SCHEMA = "json_schema"  # JSON valid against the schema in `guide`
REGEX = "regex"
EBNF = "ebnf_grammar"  # an EBNF grammar (GBNF-style, as the grammar engine reads it) whose rule `root` starts
KINDS = (JSON, JSON_SCHEMA, REGEX, EBNF)
MAX_GUIDE_CHARS = 100_000  # a schema or grammar's text: its compile time grows with it


@dataclass(frozen=True)
class GrammarSpec:
    kind: str
    guide: str = ""  # the schema, regex or grammar's text ("" for JSON)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"guided_decoding_guide_type must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind != JSON and not self.guide:
            raise ValueError(f"a {self.kind} grammar needs its text (guided_decoding_guide)")
        if len(self.guide) > MAX_GUIDE_CHARS:
            raise ValueError(f"a grammar's text is at most {MAX_GUIDE_CHARS} characters")
        if self.kind == JSON_SCHEMA:
            try:
                schema = json.loads(self.guide)
            except ValueError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("a JSON schema is an object (or true/false)")

    @classmethod
    def schema(cls, schema: dict | bool) -> GrammarSpec:
        """A json_schema grammar from the schema itself (its keys in order: the grammar keeps the order of
        an object's properties)."""
        return cls(JSON_SCHEMA, json.dumps(schema))
