"""Fifty JSON schemas of the kinds agents send (nested objects, arrays of objects, enums, required and
optional fields, numbers, booleans), each with a prompt asking for an instance: the structured-output
workload (benchmarks/structured_output.py, issue 90). Written here, not taken from any data set.

Each entity below is a compact field list: "string" / "integer" / "number" / "boolean", a list of one
type (an array of it), a dict (a nested object), or ("enum", [...]). Every entity gives two schemas:
every field required with no others allowed (OpenAI's strict mode), and the first half of the fields
required with bounds on the numbers and arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

ENTITIES: dict[str, dict] = {
    "person": {"name": "string", "age": "integer", "email": "string", "hobbies": ["string"]},
    "product": {"title": "string", "price": "number", "in_stock": "boolean",
                "category": ("enum", ["books", "toys", "food", "tools"])},
    "book": {"title": "string", "author": "string", "year": "integer", "genres": ["string"]},
    "address": {"street": "string", "city": "string", "postal_code": "string", "country": "string"},
    "weather report": {"city": "string", "temperature_c": "number",
                       "condition": ("enum", ["sunny", "cloudy", "rain", "snow"]), "humidity": "integer"},
    "calendar event": {"title": "string", "date": "string", "attendees": ["string"],
                       "location": {"name": "string", "room": "string"}},
    "recipe": {"name": "string", "servings": "integer", "ingredients": [{"item": "string", "grams": "number"}],
               "vegetarian": "boolean"},
    "movie review": {"movie": "string", "rating": "integer", "summary": "string",
                     "sentiment": ("enum", ["positive", "neutral", "negative"])},
    "support ticket": {"id": "integer", "subject": "string", "priority": ("enum", ["low", "medium", "high"]),
                       "tags": ["string"]},
    "flight": {"airline": "string", "number": "string", "departure": {"airport": "string", "time": "string"},
               "arrival": {"airport": "string", "time": "string"}},
    "invoice": {"customer": "string", "lines": [{"description": "string", "quantity": "integer", "price": "number"}],
                "paid": "boolean"},
    "todo list": {"owner": "string", "tasks": [{"title": "string", "done": "boolean"}]},
    "user profile": {"username": "string", "verified": "boolean", "followers": "integer",
                     "settings": {"theme": ("enum", ["light", "dark"]), "language": "string"}},
    "search query": {"query": "string", "filters": {"min_price": "number", "max_price": "number"},
                     "sort": ("enum", ["relevance", "price", "date"]), "limit": "integer"},
    "sensor reading": {"sensor_id": "string", "value": "number", "unit": ("enum", ["C", "F", "K"]), "ok": "boolean"},
    "restaurant": {"name": "string", "cuisine": "string", "stars": "integer", "open_days": ["string"]},
    "job posting": {"title": "string", "company": "string", "remote": "boolean", "skills": ["string"],
                    "level": ("enum", ["junior", "mid", "senior"])},
    "company": {"name": "string", "founded": "integer", "employees": "integer",
                "headquarters": {"city": "string", "country": "string"}},
    "git commit": {"sha": "string", "author": "string", "message": "string", "files_changed": ["string"]},
    "tool call": {"function": ("enum", ["get_weather", "search", "send_email"]), "arguments": {"query": "string",
                                                                                             "limit": "integer"}},
    "shopping cart": {"user": "string", "items": [{"sku": "string", "count": "integer"}], "total": "number"},
    "medical appointment": {"patient": "string", "doctor": "string", "date": "string",
                            "kind": ("enum", ["checkup", "dental", "vision"])},
    "song": {"title": "string", "artist": "string", "duration_s": "integer", "explicit": "boolean"},
    "country fact sheet": {"name": "string", "capital": "string", "population": "integer", "languages": ["string"]},
    "classification": {"label": ("enum", ["spam", "ham"]), "confidence": "number", "reasons": ["string"]},
}

KINDS = {"string", "integer", "number", "boolean"}


@dataclass(frozen=True)
class SchemaTask:
    name: str
    schema: dict
    prompt: str


def _field(spec, bounded: bool) -> dict:
    if isinstance(spec, str):
        assert spec in KINDS, spec
        out = {"type": spec}
        if bounded and spec == "integer":
            out |= {"minimum": 0, "maximum": 100000}
        return out
    if isinstance(spec, tuple):
        return {"type": "string", "enum": list(spec[1])}
    if isinstance(spec, list):
        out = {"type": "array", "items": _field(spec[0], bounded)}
        return out | ({"minItems": 1, "maxItems": 5} if bounded else {})
    return _object(spec, strict=not bounded, bounded=bounded)


def _object(fields: dict, strict: bool, bounded: bool) -> dict:
    names = list(fields)
    required = names if strict else names[: (len(names) + 1) // 2]
    out = {"type": "object", "properties": {k: _field(v, bounded) for k, v in fields.items()}, "required": required}
    return out | ({"additionalProperties": False} if strict else {})


def schema_tasks() -> list[SchemaTask]:
    """The fifty tasks: each entity strict, then each with optional fields and bounds."""
    tasks = []
    for variant in ("strict", "bounded"):
        for entity, fields in ENTITIES.items():
            schema = _object(fields, strict=variant == "strict", bounded=variant == "bounded")
            keys = ", ".join(fields)
            tasks.append(SchemaTask(f"{entity} ({variant})", schema,
                                    f"Give me a {entity} as JSON with the fields {keys}. Reply with JSON only."))
    return tasks
