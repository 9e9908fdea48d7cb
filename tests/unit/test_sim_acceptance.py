"""Acceptance models and synthetic drafts: published-range acceptance lengths for the 70B preset, the
engine's table, trees shaped like beam search's, and acceptance only along accepted parents."""

from __future__ import annotations

import random

import pytest

from adaserve_backend.speculation.token_tree import TokenTree
from sim import drafts
from sim.acceptance import PRESETS, acceptance_model, load_table


def mean_accepted(model, depth, width, n=4000, seed=0, nodes=10**6):
    """Tokens per verification of the `nodes` best-scored nodes of each tree (all by default)."""
    rng = random.Random(seed)
    total = 0
    for _ in range(n):
        p = drafts.propose(rng, model, depth, width, None)
        best = sorted(range(len(p.tree)), key=lambda j: -p.tree.scores[j])[:nodes]
        total += 1 + drafts.accept(p, TokenTree.from_selection(p.tree, sorted(best)))
    return total / n


def test_llama70b_preset_gives_published_range_acceptance_lengths():
    model = PRESETS["llama70b-1b"]
    chain4 = mean_accepted(model, 4, 1)
    assert chain4 == pytest.approx(1 + 0.8 + 0.8 * 0.78 + 0.8 * 0.78 * 0.76 + 0.8 * 0.78 * 0.76 * 0.74, rel=0.05)
    assert 3.0 <= chain4 <= 3.4
    assert 3.5 <= mean_accepted(model, 6, 4, nodes=8) <= 4.5  # a lone request's tree: n_max = 8 nodes


def test_engine_table_matches_recorded_chain_acceptance():
    model = acceptance_model("engine")
    # results/draft_eval.json: accepted tokens per verification of a depth-4 chain, one request at a
    # time, on the benchmark's families (networkx-functions, python-faq, python-howto)
    for cat, recorded in (("coding", 1.73), ("chat", 1.54), ("summary", 1.47)):
        rng, n, total = random.Random(1), 4000, 0
        for _ in range(n):
            p = drafts.propose(rng, model, 4, 1, cat)
            total += 1 + drafts.accept(p, TokenTree.from_selection(p.tree, list(range(len(p.tree)))))
        assert total / n == pytest.approx(recorded, abs=0.05)


def test_table_loader(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"name": "x", "categories": {"chat": [0.5, 0.4]}, "confidence": 0.6}')
    m = load_table(str(path))
    assert m.rates == (0.5, 0.4) and m.alignment(1, "chat") == pytest.approx(0.5 / 0.6)
    assert m.alignment(5, "chat") == pytest.approx(0.4 / 0.6)  # the last depth repeats


def test_candidate_trees_are_beam_search_shaped():
    p = drafts.propose(random.Random(0), PRESETS["llama70b-1b"], 3, 4, None)
    tree = p.tree
    assert len(tree) == 1 + 3 * 4 and tree.scores[0] == 1.0
    for j in range(1, len(tree)):
        assert tree.parents[j] < j and tree.scores[j] <= tree.scores[tree.parents[j]]


def test_a_node_is_accepted_only_after_its_parent():
    rng = random.Random(3)
    model = PRESETS["llama70b-1b"]
    for _ in range(300):
        p = drafts.propose(rng, model, 4, 3, None)
        # select a random connected subtree
        nodes = [0] + [j for j in range(1, len(p.tree)) if rng.random() < 0.7]
        keep = [j for j in nodes if all_ancestors_in(p.tree.parents, j, set(nodes))]
        sel = TokenTree.from_selection(p.tree, keep)
        acc = drafts.accept(p, sel)
        path = drafts.accepted_path(sel, p.tree, p, ())
        assert len(path) == acc + 1 and path[0] == 0
        for a, b in zip(path, path[1:]):
            assert sel.parents[b] == a  # every accepted node's parent was accepted


def all_ancestors_in(parents, j, nodes):
    while j > 0:
        if j not in nodes:
            return False
        j = parents[j]
    return True


def test_a_scaled_table_keeps_its_shape_and_caps_at_one():
    model = acceptance_model("engine")
    half, double = model.scaled(0.5), model.scaled(3.0)
    assert half.by_category["coding"] == pytest.approx(tuple(r / 2 for r in model.by_category["coding"]))
    assert half.rates == pytest.approx(tuple(r / 2 for r in model.rates))
    assert max(double.rates) == 1.0 and all(r <= 1.0 for rs in double.by_category.values() for r in rs)
    assert mean_accepted(half, 4, 1) < mean_accepted(model, 4, 1) < mean_accepted(double, 4, 1)


def test_a_copied_branch_is_accepted_where_its_tokens_are_the_true_ones():
    """Copies grafted beside the drafted nodes (speculation/lookup.graft): the walk takes the longest
    branch the target accepts, a copied node where its token is the true one at its depth."""
    from adaserve_backend.speculation.lookup import graft

    rng = random.Random(0)
    for _ in range(50):
        p = drafts.propose(rng, PRESETS["llama70b-1b"], 2, 2, None)
        drafted = drafts.accept(p, TokenTree.from_selection(p.tree, list(range(len(p.tree)))))
        graft(p.tree, [5, 6, 7], [0.9, 0.9, 0.9])
        everything = TokenTree.from_selection(p.tree, list(range(len(p.tree))))
        for truth, copied in (((5, 6, 7), 3), ((5, 6, 8), 2), ((4,), 0), ((), 0)):
            path = drafts.accepted_path(everything, p.tree, p, truth)
            assert len(path) - 1 == max(drafted, copied)
            for a, b in zip(path, path[1:]):
                assert everything.parents[b] == a


def test_a_copy_that_agrees_with_the_draft_merges_into_its_nodes():
    """Given the true tokens, the drafted nodes the target takes carry them: a copy of the same tokens
    follows those nodes (lookup.graft) instead of verifying them twice, as in the engine."""
    from adaserve_backend.speculation.lookup import graft

    rng = random.Random(1)
    for _ in range(50):
        truth = (5, 6, 7)
        p = drafts.propose(rng, PRESETS["llama70b-1b"], 2, 2, None, truth)
        before = len(p.tree)
        accepted = len(drafts.accepted_path(TokenTree.from_selection(p.tree,
                                                                     list(range(before))), p.tree, p, truth)) - 1
        graft(p.tree, list(truth), [0.9] * 3)
        assert len(p.tree) - before == 3 - accepted
        everything = TokenTree.from_selection(p.tree, list(range(len(p.tree))))
        assert len(drafts.accepted_path(everything, p.tree, p, truth)) - 1 == 3
