"""Synthetic draft proposals and their verification: what the engine's beam search and tree
verification produce, without a model.

`propose` builds a `CandidateTree` the way `speculation/beam.py` does (depth d, width w: the root's w
best children, then per level the w best extensions of the previous level by path score), with the
draft's conditional probabilities drawn from the acceptance model; it also draws, for every expanded
node, which of its candidate children the target will pick (or none). `accept` walks a selected
`TokenTree` from the root along those picks: the accepted path, then the bonus token, as
`speculation/acceptance.py` does with real logits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from adaserve_backend.speculation.token_tree import CandidateTree, TokenTree

from .acceptance import AcceptanceModel

TOKEN = 1  # every simulated token id but the end of sequence
EOS = 2  # a request's last token where its workload says it stops (SimRequest.stop_after)


@dataclass
class Proposal:
    """A candidate tree plus the hidden truth: per expanded node, the rank of the child the target
    picks (-1: none of the draft's), and the node index of each (parent, rank) child kept in the tree."""

    tree: CandidateTree
    pick: list[int] = field(default_factory=list)
    child: dict[tuple[int, int], int] = field(default_factory=dict)


def root_only() -> Proposal:
    return Proposal(CandidateTree.root_only(TOKEN), [-1])


def draft_probs(rng: random.Random, model: AcceptanceModel, width: int) -> list[float]:
    """The draft's conditional probabilities of a node's `width` best children."""
    a, b = model.beta
    q1 = rng.betavariate(a, b)
    rest, out = 1.0 - q1, [q1]
    for _ in range(width - 1):
        out.append(rest * (1 - model.tail))
        rest *= model.tail
    return out


def target_pick(rng: random.Random, alpha: float, probs: list[float]) -> int:
    """The rank the target's token has among the draft's candidates: k with probability alpha * q_k."""
    u, acc = rng.random(), 0.0
    for k, q in enumerate(probs):
        acc += alpha * q
        if u < acc:
            return k
    return -1


def propose(rng: random.Random, model: AcceptanceModel, depth: int, width: int, category: str | None) -> Proposal:
    if depth <= 0:
        return root_only()
    p = Proposal(CandidateTree([TOKEN], [-1], [1.0], [0]), [-1])
    level = [0]
    for d in range(1, depth + 1):
        alpha = model.alignment(d, category)
        ext = []  # (score, order, parent, rank)
        for j in level:
            probs = draft_probs(rng, model, width)
            p.pick[j] = target_pick(rng, alpha, probs)
            s = p.tree.scores[j]
            ext += [(-s * q, len(ext), j, k) for k, q in enumerate(probs)]
        ext.sort()
        level = []
        for neg, _, j, k in ext[:width]:
            idx = len(p.tree.tokens)
            p.tree.tokens.append(TOKEN)
            p.tree.parents.append(j)
            p.tree.scores.append(-neg)
            p.tree.draft_region.append(-1)
            p.tree.origin.append(None)
            p.pick.append(-1)
            p.child[(j, k)] = idx
            level.append(idx)
    return p


def accept(p: Proposal, selected: TokenTree) -> int:
    """Accepted draft tokens of `selected` (a tree chosen from p.tree): the walk from the root stops at
    the first node whose picked child was not drafted, was cut, or was not selected."""
    chosen = set(selected.source)
    node, accepted = 0, 0
    while True:
        nxt = p.child.get((node, p.pick[node])) if node < len(p.pick) and p.pick[node] >= 0 else None
        if nxt is None or nxt >= len(p.tree) or nxt not in chosen:
            return accepted
        node, accepted = nxt, accepted + 1


def accepted_path(selected: TokenTree, p: Proposal, accepted: int) -> list[int]:
    """Indices in `selected` of the root and its first `accepted` accepted descendants (what the
    target commits to its KV cache)."""
    where = {c: i for i, c in enumerate(selected.source)}
    path, node = [0], 0
    for _ in range(accepted):
        node = p.child[(node, p.pick[node])]
        path.append(where[node])
    return path
