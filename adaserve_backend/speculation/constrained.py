"""Speculation under a grammar: no candidate the grammar forbids reaches selection, so the SLO-customized
budget is spent on tokens the target could accept. The draft's beams are masked as they grow
(beam.py reads `beam_allowed`); copied candidates (prompt lookup, the suffix index, a
prediction) are pruned here with everything else, in one pass over each tree."""

from __future__ import annotations

from collections.abc import Sequence as Seqs

import torch

from ..grammar.state import GrammarState, allowed, forbidden
from ..sequence import Sequence
from .token_tree import CandidateTree, keep_nodes


def prune(seqs: Seqs[Sequence], cands: list[CandidateTree]) -> None:
    """Drop, from each grammar request's candidate tree, the nodes its grammar forbids (and theirs)."""
    for seq, cand in zip(seqs, cands):
        if seq.grammar is not None and len(cand) > 1:
            ok = seq.grammar.tree_allows(cand.tokens, cand.parents)
            if not all(ok):
                keep_nodes(cand, [i for i, good in enumerate(ok) if good])


def beam_allowed(states: dict[int, GrammarState | None], beam: list[int], vocab: int, vocab_ids) -> torch.Tensor:
    """Which of the draft head's `vocab` rows each beam node may extend with [len(beam), vocab]
    (`vocab_ids`: the token of each row of a head over part of the vocabulary, or None). A node the
    grammar forbids (state None) may extend with nothing."""
    size = states[0].vocab_size
    bits = torch.cat([states[j].bitmask() if states[j] is not None else forbidden(size) for j in beam])
    keep = allowed(bits, size)
    if vocab_ids is not None:
        return keep[:, vocab_ids.cpu()]
    if keep.shape[1] < vocab:  # a draft head wider than the target's vocabulary: its extra rows never
        keep = torch.cat([keep, keep.new_zeros(keep.shape[0], vocab - keep.shape[1])], dim=1)
    return keep[:, :vocab]
