"""The suffix index across requests (speculation/suffix_index.py) and the learnt rates of copied nodes
(speculation/copy_rates.py), without a model."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from adaserve_backend.speculation.copy_rates import CopyRates
from adaserve_backend.speculation.lookup import graft
from adaserve_backend.speculation.suffix_index import SuffixIndex, prior
from adaserve_backend.speculation.token_tree import CandidateTree, TokenTree

ANSWER = list(range(100, 140))


def flat_rate(key) -> float:
    return 0.9


def chain_of(p) -> list[int]:
    assert p.parents == list(range(-1, len(p.tokens) - 1)), "expected a chain"
    return p.tokens


def test_a_repeated_prompt_proposes_the_earlier_answer():
    index = SuffixIndex(10_000)
    prompt = [7, 8, 9, 10, 11, 12]
    index.extend(0, "", prompt + ANSWER)
    index.finish(0)
    assert chain_of(index.propose("", prompt, 8, flat_rate)) == ANSWER[:8]
    assert chain_of(index.propose("", prompt + ANSWER[:5], 4, flat_rate)) == ANSWER[5:9]


def test_nothing_is_proposed_without_a_long_enough_match_or_from_another_scope():
    index = SuffixIndex(10_000)
    index.extend(0, "a", [1, 2, 3, 4, 5, 6, 7])
    assert index.propose("a", [9, 2, 3, 4], 4, flat_rate).tokens == []  # 3 tokens match: below KEY_LENGTHS[0]
    assert index.propose("a", [1, 2, 3, 4], 4, flat_rate).tokens == [5, 6, 7]
    assert index.propose("b", [1, 2, 3, 4], 4, flat_rate).tokens == []


def test_continuations_that_disagree_branch_with_their_shares():
    index = SuffixIndex(10_000)
    ctx = [1, 2, 3, 4]
    index.extend(0, "", ctx + [5, 6])
    index.extend(1, "", ctx + [5, 6])
    index.extend(2, "", ctx + [9])
    seen = []
    p = index.propose("", ctx, 8, lambda key: seen.append(key) or prior(key))
    tree = {tok: (p.tokens[par] if par >= 0 else None) for tok, par in zip(p.tokens, p.parents)}
    assert tree == {5: None, 6: 5, 9: None} and p.tokens[0] == 5  # best path probability first
    shares = {tok: key[2] for tok, key in zip(p.tokens, p.keys)}
    assert shares == {5: 1, 6: 3, 9: 0}  # a majority, unanimous twice, a minority


def test_the_longest_match_wins_over_more_recent_short_ones():
    index = SuffixIndex(10_000)
    question = list(range(200, 230))
    index.extend(0, "", question + [1, 2, 3, 4] + [50, 51])  # asked long ago, with its header
    for i in range(1, 20):  # then many others ending in the same header
        index.extend(i, "", [300 + i] * 20 + [1, 2, 3, 4] + [60 + i])
    p = index.propose("", question + [1, 2, 3, 4], 2, flat_rate)
    assert p.tokens == [50, 51]
    assert p.keys[0][1] == 3  # matched at least 32 tokens


def test_memory_is_bounded_and_finished_requests_go_first():
    index = SuffixIndex(max_tokens=100)
    index.extend(0, "", list(range(1000, 1060)))  # still running
    for i in range(1, 30):
        index.extend(i, "", [i] * 5 + list(range(2000 + 40 * i, 2000 + 40 * i + 35)))
        index.finish(i)
        assert index.num_tokens <= 100
    for i in range(1, 27):  # evicted: their keys went with them, nothing of theirs is proposed
        assert index.propose("", list(range(2000 + 40 * i, 2000 + 40 * i + 20)), 3, flat_rate).tokens == []
    # the running one stayed
    assert index.propose("", list(range(1000, 1010)), 3, flat_rate).tokens == [1010, 1011, 1012]
    for i in range(30, 40):  # unfinished ones too are evicted once nothing else is left
        index.extend(i, "", list(range(5000 + 100 * i, 5000 + 100 * i + 90)))
    assert index.num_tokens <= 100
    index.extend(0, "", list(range(1000, 1080)))  # an evicted running request is not indexed again
    assert index.num_tokens <= 100


def test_a_shared_key_outlives_the_evicted_request_that_first_had_it():
    index = SuffixIndex(max_tokens=30)
    index.extend(0, "", [7, 8, 9, 10, 11])
    index.finish(0)
    index.extend(1, "", [7, 8, 9, 10, 12])  # the key (7, 8, 9, 10) now occurred twice
    index.finish(1)
    assert sorted(index.propose("", [7, 8, 9, 10], 2, flat_rate).tokens) == [11, 12]
    index.extend(2, "", list(range(300, 325)))  # evicts request 0 only
    assert index.propose("", [7, 8, 9, 10], 2, flat_rate).tokens == [12]
    index.finish(2)
    index.extend(3, "", [7, 8, 9, 10, 13])  # evicts request 1: the key is request 3's alone
    assert index.propose("", [7, 8, 9, 10], 2, flat_rate).tokens == [13]


def test_an_indexed_token_costs_a_few_hundred_bytes():
    """The index stays filled for as long as the server runs: its bound is what it costs, so a token's
    bytes are bounded too (a long key per position mostly occurs once and must not carry a list)."""
    rng = random.Random(0)
    docs = [[1, 2, 3, 4, 5, 6] + [rng.randrange(300, 49_000) for _ in range(300)] for _ in range(100)]
    tracemalloc.start()
    try:
        index = SuffixIndex(20_000)
        for i, doc in enumerate(docs):
            index.extend(i, "", doc)
            index.finish(i)
        per_token = tracemalloc.get_traced_memory()[0] / index.num_tokens
    finally:
        tracemalloc.stop()
    assert per_token < 320, f"{per_token:.0f} bytes per indexed token"


def test_the_index_grows_incrementally_as_tokens_commit():
    a, b = SuffixIndex(10_000), SuffixIndex(10_000)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6] * 4
    for n in range(1, len(tokens) + 1):
        a.extend(0, "", tokens[:n])
    b.extend(0, "", tokens)
    for n in range(4, len(tokens)):
        assert a.propose("", tokens[:n], 5, flat_rate) == b.propose("", tokens[:n], 5, flat_rate)


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        SuffixIndex(0)


def test_rates_learn_from_nodes_whose_parent_was_accepted_only():
    cand = CandidateTree([10], [-1], [1.0], [-1])
    graft(cand, [11, 12], [0.5, 0.5], origins=["a", "b"])
    graft(cand, [13], [0.5], origins=["c"])
    tree = TokenTree.from_selection(cand, [0, 1, 2, 3])
    rates = CopyRates()
    for _ in range(50):
        rates.observe(cand, tree, [0, 1])  # 11 accepted, 12 rejected below it, 13 rejected
    assert rates.rate("a", 0.5) > 0.9 and rates.rate("b", 0.5) < 0.1 and rates.rate("c", 0.5) < 0.1
    tried_b = rates.table()["b"][1]
    rates.observe(cand, tree, [0])  # 11 rejected: nothing is learnt about 12
    assert rates.table()["b"][1] == tried_b
    assert set(rates.table()) == {"a", "b", "c"}
    assert rates.rate("never seen", 0.3) == pytest.approx(0.3)
