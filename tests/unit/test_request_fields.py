"""The request contract (adaserve_backend/request_fields.py) is the one list of request fields: every
model's config.pbtxt, the ensemble's interface in docs/triton.md, the parser's defaults and the tensors
callers send all agree with it."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from adaserve_backend.request_fields import BY_NAME, FIELDS, Role, names, tensors
from adaserve_backend.triton.protocol import RESPONSE_OPTIONS, parse_request

ROOT = pathlib.Path(__file__).resolve().parents[2]
INPUT = re.compile(r'\{\s*name:\s*"(\w+)",\s*data_type:\s*TYPE_(\w+),\s*dims:\s*\[\s*(-?\d+)\s*\]'
                   r'(,\s*optional:\s*true)?')


def config_inputs(model: str) -> dict[str, tuple[str, list[int], bool]]:
    text = (ROOT / "model_repository" / model / "config.pbtxt").read_text()
    section = text[text.index("input ["):text.index("output [")]
    section = "\n".join(line.split("#")[0] for line in section.splitlines())
    return {m[1]: (m[2], [int(m[3])], bool(m[4])) for m in INPUT.finditer(section)}


@pytest.mark.parametrize("model, roles", [
    ("adaserve", tuple(Role)),
    ("ensemble", (Role.PROMPT, Role.TEXT, Role.CLIENT)),
    ("preprocessing", (Role.TEXT,)),
])
def test_every_config_pbtxt_declares_exactly_its_fields_with_their_types(model, roles):
    declared, fields = config_inputs(model), set(names(*roles))
    assert set(declared) == fields, (f"model_repository/{model}/config.pbtxt lacks {sorted(fields - set(declared))} "
                                     f"and declares {sorted(set(declared) - fields)} beyond request_fields.FIELDS")
    for name, (dtype, dims, optional) in declared.items():
        f = BY_NAME[name]
        assert (dtype, dims) == (f.dtype, f.dims), name
        required = model == "preprocessing" and f.required_in_preprocessing
        assert optional != required, f"{model}: {name} should be {'required' if required else 'optional'}"


def test_the_ensembles_interface_in_the_docs_lists_every_field_a_client_sends():
    doc = (ROOT / "docs" / "triton.md").read_text()
    table = doc[doc.index("## Interface (`ensemble`)"):doc.index("## Errors")]
    missing = [n for n in names(Role.TEXT, Role.CLIENT) if f"`{n}`" not in table]
    assert not missing, f"docs/triton.md's interface table lacks {missing}"


def test_what_a_request_leaves_out_the_parser_fills_in_with_the_tables_defaults():
    req, options = parse_request("r", {"input_ids": np.array([1, 2, 3], dtype=np.int32)})
    assert req.max_tokens == BY_NAME["max_tokens"].default
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.top_k) == tuple(
        BY_NAME[n].default for n in ("temperature", "top_p", "top_k"))
    assert req.min_tokens == BY_NAME["min_tokens"].default and req.sampling.seed is None
    assert all(getattr(options, n) == BY_NAME[n].default for n in RESPONSE_OPTIONS)


def test_tensors_travel_in_their_fields_types_and_what_is_left_out_is_not_sent():
    t = tensors({"text_input": "héllo", "max_tokens": 8, "stop_words": ["a", "b"], "seed": 2**64 - 1,
                 "tpot_slo_ms": None, "stream": True})
    assert set(t) == {"text_input", "max_tokens", "stop_words", "seed", "stream"}
    assert t["text_input"].tolist() == ["héllo".encode()] and t["stop_words"].tolist() == [b"a", b"b"]
    assert t["max_tokens"].dtype == np.int32 and t["seed"].dtype == np.uint64 and t["stream"].dtype == np.bool_
    req, options = parse_request("r", {"input_ids": np.array([1], dtype=np.int32), **tensors(
        {"max_tokens": 8, "stop_words": ["a"], "stream": True, "seed": 7})})
    assert (req.max_tokens, req.stop_strings, options.stream, req.sampling.seed) == (8, ("a",), True, 7)
    assert parse_request("r", {"input_ids": np.array([1], dtype=np.int32),
                               **tensors({"ignore_eos": True})})[0].ignore_eos


def test_each_field_is_named_once():
    assert len({f.name for f in FIELDS}) == len(FIELDS)
