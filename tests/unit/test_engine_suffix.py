"""Suffix speculation in the engine: what one request answered becomes the next one's proposals, within
a scope, and greedy outputs stay the float32 oracle's (tiny checkpoints, an unrelated draft)."""

from __future__ import annotations

import pytest

from adaserve_backend.request import Request
from adaserve_backend.slo import SLO
from tests.engines import assert_all_blocks_free, make_engine, reference
from tests.model_fixtures import tiny_checkpoint


def served_one_by_one(engine, reqs: list[Request]) -> dict[str, tuple[list[int], int]]:
    """Each request alone, in turn: (its output, the drafts it accepted)."""
    out = {}
    for r in reqs:
        engine.add_request(r)
        tokens, accepted = [], 0
        for o in engine.drain():
            tokens += o.new_token_ids
            if o.finished:
                accepted = o.stats.accepted_drafts
        out[r.request_id] = (tokens, accepted)
    return out


def ask(request_id: str, prompt: list[int], tenant: str | None = None) -> Request:
    return Request(request_id, prompt, max_tokens=24, min_tokens=24, slo=SLO(tpot_ms=20.0), tenant=tenant)


@pytest.mark.parametrize("scope", ["shared", "tenant", "off"])
def test_a_question_asked_again_is_answered_from_the_index_within_its_scope(scope):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), "adaserve", lookup_ngram=0, suffix_scope=scope)
    prompt = [5, 17, 33, 48, 61, 72, 90, 104]
    reqs = [ask("first", prompt, "a"), ask("again, same tenant", prompt, "a"), ask("again, other tenant", prompt, "b"),
            ask("again, no tenant", prompt)]
    got = served_one_by_one(engine, reqs)
    want = reference(target, reqs[0])
    assert all(tokens == want for tokens, _ in got.values())  # the oracle's, wherever the drafts came from
    first, same, other, anonymous = (got[r.request_id][1] for r in reqs)
    from_index = {"shared": (True, True, True), "tenant": (True, False, False), "off": (False, False, False)}[scope]
    for accepted, expected in zip((same, other, anonymous), from_index):
        assert (accepted >= len(want) // 2) == expected, (scope, first, same, other, anonymous)
    assert_all_blocks_free(engine)


def test_the_index_learns_what_verification_accepts():
    engine = make_engine(tiny_checkpoint("llama"), tiny_checkpoint("llama", seed=1), "adaserve", lookup_ngram=0)
    prompt = [9, 8, 7, 6, 5, 4, 3, 2]
    served_one_by_one(engine, [ask(f"r{i}", prompt) for i in range(3)])
    measured = engine.draft.copies.rates.table()
    assert measured and all(key[0] == "suffix" for key in measured)
    assert max(rate for rate, _ in measured.values()) > 0.9  # verbatim repeats: every copied token held
