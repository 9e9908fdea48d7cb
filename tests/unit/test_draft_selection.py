"""A draft is chosen on held-out training families only, never on the benchmark's."""

from __future__ import annotations

import pytest

from tools.draft.evaluate import SHAPES, validation_score


def family(agreement: float, tokens: float) -> dict:
    return {"top1_by_depth": [agreement, 0.3], **{f"accepted/verify {n}": tokens for n, *_ in SHAPES}}


def test_the_benchmark_families_never_choose_a_draft():
    entry = {"families": {"code:scipy": family(0.5, 2.0), "instruction:poem": family(0.3, 1.6),
                          "bench:networkx-functions": family(0.9, 3.0)}}
    assert validation_score(entry) == pytest.approx({"agreement": 0.4, "tokens_per_verify": 1.8})
    with pytest.raises(ValueError, match="held-out"):
        validation_score({"families": {"bench:python-faq": family(0.9, 3.0)}})
