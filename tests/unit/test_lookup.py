"""Prompt lookup (speculation/lookup.py) and the depth cut of a tree it grafted onto."""

import pytest

from adaserve_backend.config import SpeculationConfig
from adaserve_backend.speculation.lookup import HIT_RATE, NgramIndex, graft
from adaserve_backend.speculation.token_tree import CandidateTree, TokenTree, truncate_depth


def test_longest_suffix_wins_and_its_latest_occurrence():
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [5, 1, 2, 3, 9, 1, 2, 7, 1, 2]
    copied, probs = NgramIndex(3).propose(tokens, 4)
    assert copied == [7, 1, 2]  # "1 2" last occurred at 5-6, followed by 7; "9 1 2" never ended the list
    assert probs == list(HIT_RATE[2][:3])
    tokens2 = [4, 1, 2, 3, 8, 4, 1, 2]
    assert NgramIndex(3).propose(tokens2, 2) == ([3, 8], list(HIT_RATE[3][:2]))  # "4 1 2" beats "1 2"


def test_no_earlier_occurrence_proposes_nothing_and_a_short_copy_stops_at_the_end():
    assert NgramIndex(3).propose([1, 2, 3, 4], 4) == ([], [])
    assert NgramIndex(1).propose([7, 8, 7], 5)[0] == [8, 7]  # what followed 7: the rest of the list


def test_incremental_index_equals_a_fresh_one_and_resets_on_another_list():
    index = NgramIndex(3)
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 1, 5, 3, 2, 6]
    for n in range(1, len(seq) + 1):
        assert index.propose(seq[:n], 3) == NgramIndex(3).propose(seq[:n], 3)
    assert index.propose([1, 2, 1], 2) == ([2, 1], list(HIT_RATE[1][:2]))


def test_bad_ngram_length_fails_loudly():
    with pytest.raises(ValueError):
        NgramIndex(0)
    with pytest.raises(ValueError):
        SpeculationConfig(lookup_ngram=max(HIT_RATE) + 1)


def beam_tree() -> CandidateTree:
    # root 10; children 11 (0.6), 12 (0.3); 11's child 13 (0.4)
    return CandidateTree([10, 11, 12, 13], [-1, 0, 0, 1], [1.0, 0.6, 0.3, 0.4], [0, 1, 2, -1])


def scores_never_grow(tree: CandidateTree) -> bool:
    return all(tree.scores[i] <= tree.scores[p] for i, p in enumerate(tree.parents) if p >= 0)


def test_graft_follows_matching_nodes_raises_their_scores_and_appends_the_rest():
    tree = beam_tree()
    graft(tree, [12, 20, 21], [0.8, 0.5, 0.5])
    assert tree.tokens == [10, 11, 12, 13, 20, 21]
    assert tree.parents == [-1, 0, 0, 1, 2, 4]
    assert tree.scores[2] == pytest.approx(0.8)  # raised from 0.3
    assert tree.scores[4:] == pytest.approx([0.4, 0.2])
    assert tree.draft_region[4:] == [-1, -1]
    assert scores_never_grow(tree)
    TokenTree.from_selection(tree, list(range(len(tree))))  # still a valid topological tree


def test_graft_continues_from_the_beams_higher_score_and_never_duplicates_a_child():
    tree = beam_tree()
    graft(tree, [11, 13, 30], [0.1, 0.5, 0.5])
    assert tree.tokens == [10, 11, 12, 13, 30]
    assert tree.scores[1] == pytest.approx(0.6) and tree.scores[3] == pytest.approx(0.4)  # not lowered
    assert tree.scores[4] == pytest.approx(0.2)  # 0.4 (the beam's) x 0.5
    assert scores_never_grow(tree)


def test_truncate_depth_keeps_a_grafted_chain_that_sits_after_deeper_levels():
    tree = beam_tree()
    graft(tree, [12, 20, 21], [0.8, 0.5, 0.5])  # levels: 0, 1, 1, 2, 2, 3
    truncate_depth(tree, 1)
    assert tree.tokens == [10, 11, 12] and tree.parents == [-1, 0, 0]
    tree = beam_tree()
    graft(tree, [12, 20, 21], [0.8, 0.5, 0.5])
    truncate_depth(tree, 2)
    assert tree.tokens == [10, 11, 12, 13, 20] and tree.parents == [-1, 0, 0, 1, 2]
    assert len(tree.scores) == len(tree.draft_region) == 5


def test_lookup_rates_count_a_copied_token_once_its_predecessors_were_right():
    from tools.draft.lookup_rates import rates

    # contexts 1 2 3 | 1 2 3 1: "1" copies 2 3 (right), "1 2" copies 3 1 (right), "1 2 3" copies 1 (right),
    # then the sequence ends (its second token is never tried); a wrong first copy stops the count
    got = rates([([1, 2, 3], [1, 2, 3, 1])], 3, 2)
    assert got[1] == [1.0, 1.0] and got[2] == [1.0, 1.0] and got[3][0] == 1.0 and got[3][1] != got[3][1]
    wrong = rates([([5, 6, 5], [9, 9])], 1, 2)[1]  # "5" copies 6 5; the target says 9
    assert wrong[0] == 0.0 and wrong[1] != wrong[1]
