"""The benchmark's prompts are never the draft's training prompts (the draft would look better on
text it was distilled on than on what users send): not one prompt in common, no source file in
common, and under 1% of any family's word 8-grams in the training text."""

from __future__ import annotations

import hashlib
import os
import re

import pytest

from harness.prompt_sources import CODE_PACKAGES, code_family_sources, vendored
from harness.prompts import BENCHMARK_FAMILIES, PROMPT_SETS, benchmark_prompts, family_prompts, normalize
from tools.draft.data import CODE_PACKAGES as DRAFT_CODE_PACKAGES
from tools.draft.data import DOC_PACKAGES, build_prompts, draft_sources

MAX_SHARED_8GRAMS = 0.01


@pytest.fixture(scope="module")
def drafted() -> list[str]:
    train, held_out = build_prompts()
    return [p.text for p in train + held_out]


def grams(text: str, n: int = 8) -> set[int]:
    words = normalize(text).split()
    return {hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1)}


@pytest.mark.parametrize("prompt_set", sorted(PROMPT_SETS))
def test_no_benchmark_prompt_is_a_draft_training_prompt(prompt_set, drafted):
    seen = {normalize(t) for t in drafted}
    bench = PROMPT_SETS[prompt_set]()
    overlap = [(cat, text[:80]) for cat, items in bench.items() for text, _ in items if normalize(text) in seen]
    assert not overlap, f"{len(overlap)} benchmark prompts are draft training prompts, e.g. {overlap[:3]}"
    assert set(bench) == set(BENCHMARK_FAMILIES) and all(bench.values())


def test_no_family_shares_its_word_8grams_with_the_training_text(drafted):
    trained = set().union(*map(grams, drafted))
    for family in [f for fams in BENCHMARK_FAMILIES.values() for f in fams]:
        ours = [grams(t) for t, _ in family_prompts(family)]
        shared = sum(len(g & trained) for g in ours) / sum(len(g) for g in ours)
        assert shared < MAX_SHARED_8GRAMS, f"{family}: {shared:.1%} of its 8-grams are in the draft's training text"


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_the_draft_reads_no_source_file_a_benchmark_family_reads():
    draft = [p for pkg in dict.fromkeys(DRAFT_CODE_PACKAGES + DOC_PACKAGES) for p in draft_sources(pkg)]
    bench = [p for fam in CODE_PACKAGES for p in code_family_sources(fam)]
    assert not {os.path.realpath(p) for p in draft} & {os.path.realpath(p) for p in bench}
    # nor a copy of one (a vendored package), nor a folder named after a benchmark package
    small = 256  # empty __init__.py files and the like are the same everywhere
    copies = {_digest(p) for p in draft if os.path.getsize(p) > small} & {
        _digest(p) for p in bench if os.path.getsize(p) > small}
    assert not copies, f"{len(copies)} benchmark source files are copied into the draft's packages"
    names = set(CODE_PACKAGES.values())
    assert not [p for p in draft if names & set(p.split(os.sep)[:-1]) or vendored(p)]


def test_every_category_has_families_of_distinct_prompts():
    bench = benchmark_prompts()
    assert set(bench) == set(BENCHMARK_FAMILIES)
    for cat, items in bench.items():
        texts = [normalize(t) for t, _ in items]
        assert len(set(texts)) == len(texts), f"{cat}: duplicate prompts"
        for family in BENCHMARK_FAMILIES[cat]:
            assert len(family_prompts(family)) >= 100, family
    # enough that a long run (a few thousand requests in the 60/20/20 mix) deals no prompt twice
    assert len(bench["coding"]) >= 1200 and len(bench["chat"]) >= 400 and len(bench["summary"]) >= 400
    # code is completed raw; questions and passages go through the chat template
    assert {cat: {chat for _, chat in items} for cat, items in bench.items()} == {"coding": {False},
                                                                                  "chat": {True}, "summary": {True}}
    assert all(t.startswith("def ") and '"""' in t for t, _ in bench["coding"])
    assert all(t.endswith("?") and not re.search(r"\b[BCEFILSX]<", t) for t, _ in bench["chat"])  # no POD markup


def test_normalize_collapses_whitespace_only():
    assert normalize("  a\n\tb  c ") == "a b c" and normalize("a b") != normalize("ab")
