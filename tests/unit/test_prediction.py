"""Predicted Outputs: the client's prediction copied into the speculation trees. The output never
changes; a right prediction is accepted in long chains (fewer verifications), a wrong one costs none."""

from __future__ import annotations

import dataclasses

from adaserve_backend.speculation.prediction import PredictionIndex
from tests.engines import make_engine, reference, workload
from tests.model_fixtures import tiny_checkpoint


def run(reqs, policy: str = "adaserve"):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), policy, lookup_ngram=0)
    tokens, last = {}, {}
    for r in reqs:
        engine.add_request(r)
    for o in engine.drain():
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        last[o.request_id] = o
    return tokens, last


def test_a_right_prediction_is_accepted_in_chains_and_a_wrong_one_changes_nothing():
    target = tiny_checkpoint("llama")
    base = dataclasses.replace(workload(target, n=1, seed=6)[0], max_tokens=16, min_tokens=16)
    want = reference(target, base)
    right = dataclasses.replace(base, request_id="right", prediction=tuple(want))
    wrong = dataclasses.replace(base, request_id="wrong", prediction=tuple(range(40, 60)))
    plain = dataclasses.replace(base, request_id="plain")
    tokens, last = run([right, wrong, plain])
    assert tokens["right"] == tokens["wrong"] == tokens["plain"] == want
    stats = {k: o.stats for k, o in last.items()}
    assert stats["right"].accepted_prediction_tokens >= 8
    assert stats["right"].verifications < stats["plain"].verifications
    assert stats["right"].rejected_prediction_tokens == len(want) - stats["right"].accepted_prediction_tokens
    assert stats["wrong"].accepted_prediction_tokens == 0 and stats["wrong"].rejected_prediction_tokens == 20
    assert stats["plain"].prediction_tokens == 0


def test_the_index_walks_the_prediction_in_order():
    index = PredictionIndex([1, 2, 3, 9, 1, 2, 4, 5])
    assert index.propose([7, 1, 2], 2) == (2, [3, 9])  # the first occurrence at or after the cursor
    assert index.propose([1, 2, 3, 9, 1, 2], 3) == (5, [4, 5])  # the longest match, then past it
    assert index.propose([8], 2) == (0, [])
