"""The benchmark's prompts are never the draft's training prompts (the draft would look better on
text it was distilled on than on what users send)."""

from __future__ import annotations

import pytest

from harness.prompts import BENCHMARK_FAMILIES, PROMPT_SETS, benchmark_prompts, normalize
from tools.draft.data import build_prompts


@pytest.fixture(scope="module")
def drafted() -> set[str]:
    train, held_out = build_prompts()
    return {normalize(p.text) for p in train + held_out}


@pytest.mark.parametrize("prompt_set", sorted(PROMPT_SETS))
def test_no_benchmark_prompt_is_a_draft_training_prompt(prompt_set, drafted):
    bench = PROMPT_SETS[prompt_set]()
    overlap = [(cat, text[:80]) for cat, items in bench.items() for text, _ in items if normalize(text) in drafted]
    assert not overlap, f"{len(overlap)} benchmark prompts are draft training prompts, e.g. {overlap[:3]}"
    assert set(bench) == set(BENCHMARK_FAMILIES) and all(bench.values())


def test_every_category_has_a_family_of_distinct_prompts():
    bench = benchmark_prompts()
    assert set(bench) == set(BENCHMARK_FAMILIES)
    for cat, items in bench.items():
        texts = [normalize(t) for t, _ in items]
        assert len(texts) >= 100, cat
        assert len(set(texts)) == len(texts), f"{cat}: duplicate prompts"
    # code is completed raw; questions and passages go through the chat template
    assert {cat: {chat for _, chat in items} for cat, items in bench.items()} == {"coding": {False},
                                                                                  "chat": {True}, "summary": {True}}
    assert all(t.startswith("def ") and '"""' in t for t, _ in bench["coding"])
    assert all(t.endswith("?") for t, _ in bench["chat"])


def test_normalize_collapses_whitespace_only():
    assert normalize("  a\n\tb  c ") == "a b c" and normalize("a b") != normalize("ab")
