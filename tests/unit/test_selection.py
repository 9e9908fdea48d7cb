"""SLO-customized and throughput-optimized selection as pure functions (no model)."""

from __future__ import annotations

import itertools
import random

import pytest

from adaserve_backend.scheduler.speculation_size import required_accepted
from adaserve_backend.speculation.selection import (
    SelectionParams,
    expected_accepted,
    goodput_prefix,
    select_tokens,
    slo_customized_selection,
    throughput_selection,
)
from adaserve_backend.speculation.token_tree import CandidateTree, TokenTree


def beam_tree(level_scores: list[list[tuple[int, float]]]) -> CandidateTree:
    """Candidate tree from levels of (parent, score); node 0 is the root."""
    parents, scores = [-1], [1.0]
    for level in level_scores:
        for parent, score in level:
            parents.append(parent)
            scores.append(score)
    return CandidateTree(tokens=list(range(len(parents))), parents=parents, scores=scores)


# The paper's Figure 5: beam width 2, depth 3. Node i is t_i in the caption (t_1..t_6).
FIG5_R0 = beam_tree([[(0, 0.7), (0, 0.2)], [(1, 0.49), (1, 0.14)], [(3, 0.34), (3, 0.1)]])
FIG5_R1 = beam_tree([[(0, 0.5), (0, 0.4)], [(1, 0.3), (2, 0.2)], [(3, 0.15), (4, 0.12)]])


def test_figure5_example():
    # The caption's A_cap (0.6, 0.8) counts draft tokens only; our accounting adds the root's 1.0.
    caps = [1.0 + 0.6, 1.0 + 0.8]
    slo_only = select_tokens([FIG5_R0, FIG5_R1], caps, SelectionParams(budget=5, n_max=8))
    assert slo_only == [[0, 1], [0, 1, 2]]  # r0 takes t1; r1 takes t1 and t2 (0.5 + 0.4 > 0.8)
    full = select_tokens([FIG5_R0, FIG5_R1], caps, SelectionParams(budget=8, n_max=8))
    # throughput phase adds t3 and t5 to r0 and t3 to r1
    assert full == [[0, 1, 3, 5], [0, 1, 2, 3]]


def random_candidate(rng: random.Random, depth: int, width: int) -> CandidateTree:
    levels, prev = [], [0]
    score = {0: 1.0}
    nid = 1
    for _ in range(depth):
        level = []
        for _ in range(width):
            parent = rng.choice(prev)
            s = score[parent] * rng.uniform(0.05, 0.95)
            score[nid] = s
            level.append((parent, s))
            nid += 1
        prev = list(range(nid - width, nid))
        levels.append(level)
    return beam_tree(levels)


def is_connected(tree: CandidateTree, nodes: list[int]) -> bool:
    chosen = set(nodes)
    return 0 in chosen and all(tree.parents[j] in chosen for j in nodes if j != 0)


def test_selection_invariants_on_random_trees():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 6)
        cands = [random_candidate(rng, rng.randint(1, 5), rng.randint(1, 4)) for _ in range(n)]
        caps = [rng.uniform(0.5, 4.0) for _ in range(n)]
        params = SelectionParams(budget=rng.randint(n, 40), n_max=rng.randint(1, 8))
        sel = select_tokens(cands, caps, params)
        assert sum(len(s) for s in sel) <= max(params.budget, n)
        for tree, nodes in zip(cands, sel):
            assert is_connected(tree, nodes) and len(set(nodes)) == len(nodes)
            TokenTree.from_selection(tree, nodes)  # parents resolve inside the selection
        slo, left = slo_customized_selection(cands, caps, params)
        assert all(len(s) <= max(params.n_max, 1) for s in slo)
        assert sum(len(s) for s in slo) + left <= max(params.budget, n)
        assert throughput_selection(cands, slo, left) == sel


def test_the_most_demanding_request_is_served_first():
    caps = [1.5, 3.0]
    got = select_tokens([FIG5_R0, FIG5_R1], caps, SelectionParams(budget=4, n_max=8))
    assert len(got[1]) == 3 and len(got[0]) == 1


def connected_subtrees(tree: CandidateTree) -> list[list[int]]:
    out = []
    for mask in range(1 << (len(tree) - 1)):
        nodes = [0] + [j for j in range(1, len(tree)) if mask >> (j - 1) & 1]
        if is_connected(tree, nodes):
            out.append(nodes)
    return out


def brute_force(trees: list[CandidateTree], a: list[float], budget: int) -> float | None:
    best = None
    for combo in itertools.product(*(connected_subtrees(t) for t in trees)):
        if sum(len(c) for c in combo) > budget:
            continue
        values = [expected_accepted(t, c) for t, c in zip(trees, combo)]
        if any(v < ai - 1e-12 for v, ai in zip(values, a)):
            continue
        total = sum(values)
        best = total if best is None else max(best, total)
    return best


def test_select_tokens_equals_brute_force_on_small_trees():
    """The production selection (SLO phase, then throughput phase) reaches the optimum of Algorithm 1
    whenever the SLO constraints can be met, and stays a valid, in-budget selection when not."""
    rng = random.Random(11)
    checked = invalid = 0
    for _ in range(150):
        n = rng.randint(1, 3)
        trees = []
        for _ in range(n):  # arbitrary trees with f(child) <= f(parent)
            size = rng.randint(1, 6)
            parents, scores = [-1], [1.0]
            for j in range(1, size):
                p = rng.randrange(j)
                parents.append(p)
                scores.append(scores[p] * rng.uniform(0.05, 1.0))
            trees.append(CandidateTree(list(range(size)), parents, scores))
        a = [rng.uniform(1.0, 2.0) for _ in range(n)]
        budget = rng.randint(n, n + 8)
        ref = brute_force(trees, a, budget)
        got = select_tokens(trees, a, SelectionParams(budget=budget, n_max=64))
        assert all(is_connected(t, g) for t, g in zip(trees, got))
        assert sum(len(g) for g in got) <= budget
        if ref is None:
            invalid += 1
            continue
        assert all(expected_accepted(t, g) >= ai - 1e-9 for t, g, ai in zip(trees, got, a)), "every SLO met"
        assert sum(expected_accepted(t, g) for t, g in zip(trees, got)) == pytest.approx(ref)
        checked += 1
    assert checked > 40 and invalid > 5


def test_required_accepted_is_what_keeps_a_request_on_its_slo():
    slo, t_iter = 0.030, 0.030
    # on schedule, iterations as long as the SLO: one token per iteration keeps it there
    assert required_accepted(10 * slo, t_iter, slo, 10) == pytest.approx(1.0)
    # one SLO behind: it must catch up a token this iteration
    assert required_accepted(11 * slo, t_iter, slo, 10) == pytest.approx(2.0)
    # iterations twice the SLO: two tokens each just to keep pace
    assert required_accepted(10 * slo, 2 * t_iter, slo, 10) == pytest.approx(2.0)
    # ahead of schedule: less than a token is needed (the root's bonus token always comes)
    assert required_accepted(5 * slo, t_iter, slo, 10) < 1.0
    # the definition: after accepting A tokens the request's TPOT equals its SLO exactly
    elapsed, decoded = 0.47, 9
    a = required_accepted(elapsed, t_iter, slo, decoded)
    assert (elapsed + t_iter) / (decoded + a) == pytest.approx(slo)


def test_goodput_prefix_maximizes_expected_tokens_per_ms():
    gains = [0.9, 0.8, 0.5, 0.3, 0.1, 0.05]
    flat = lambda v: 50.0  # noqa: E731  below the knee every token is free: take them all
    assert goodput_prefix(1, 1.0, gains, flat) == len(gains)
    linear = lambda v: 50.0 + 10.0 * v  # noqa: E731
    best = max(range(len(gains) + 1), key=lambda k: (1.0 + sum(gains[:k])) / linear(1 + k))
    assert goodput_prefix(1, 1.0, gains, linear) == best == 3
    # a CPU: one token takes a fast path, two to seven cost more than eight
    def cpu(v):
        return {1: 55.0, 2: 80.0, 3: 78.0, 4: 74.0, 5: 72.0, 6: 71.0, 7: 70.0}.get(v, 69.0 + 2.0 * (v - 8))

    assert goodput_prefix(1, 1.0, [0.03] * 8, cpu) == 0  # weak guesses: no speculation
    assert goodput_prefix(1, 1.0, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.01, 0.01], cpu) == 7  # past the 2..7 hump


def test_goodput_selection_keeps_the_slo_phase_and_trims_the_rest():
    costly = SelectionParams(budget=8, n_max=8, iteration_ms=lambda v: 10.0 * v)  # every token costs its share
    caps = [2.0, 1.0]
    slo, left = slo_customized_selection([FIG5_R0, FIG5_R1], caps, costly)
    assert throughput_selection([FIG5_R0, FIG5_R1], slo, left, costly) == [sorted(s) for s in slo]
    free = SelectionParams(budget=8, n_max=8, iteration_ms=lambda v: 10.0)
    assert select_tokens([FIG5_R0, FIG5_R1], caps, free) == select_tokens([FIG5_R0, FIG5_R1],
                                                                          caps, SelectionParams(8, 8))
    # calibration scales scores into probabilities: an overconfident draft needs more nodes for A = 2
    half = SelectionParams(budget=8, n_max=8, calibration=0.5)
    assert len(slo_customized_selection([FIG5_R0], [2.0],
                                        half)[0][0]) > len(slo_customized_selection([FIG5_R0], [2.0], costly)[0][0])
