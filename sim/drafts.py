"""Synthetic draft proposals and their verification: what the engine's beam search and tree
verification produce, without a model.

`propose` builds a `CandidateTree` the way `speculation/beam.py` does (depth d, width w: the root's w
best children, then per level the w best extensions of the previous level by path score), with the
draft's conditional probabilities drawn from the acceptance model; it also draws, for every expanded
node, which of its candidate children the target will pick (or none). `accepted_path` walks a selected
`TokenTree` from the root along those picks (and along copies whose tokens are the true ones): the
accepted path, then the bonus token, as `speculation/acceptance.py` does with real logits. Drafted
nodes carry negative token ids that name them (drafted_token), so they stay themselves when a tree is
cut; where the true tokens are known, those the target will take carry them instead, so a copy of the
same tokens merges into them (lookup.graft) as in the engine, and no copy merges into any other.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from adaserve_backend.speculation.token_tree import CandidateTree, TokenTree

from .acceptance import AcceptanceModel

TOKEN = 1  # a simulated output token where the request's true tokens are not known
EOS = 2  # a request's last token where its workload says it stops (SimRequest.stop_after)


def drafted_token(node: int) -> int:
    """The token id of the proposal's drafted node `node` (>= 1): negative, unique in the proposal."""
    return -node


def drafted_node(token: int) -> int | None:
    """The proposal's node index a tree token names, None for a copied token or the root."""
    return -token if token < 0 else None


@dataclass
class Proposal:
    """A candidate tree plus the hidden truth: per expanded node, the rank of the child the target
    picks (-1: none of the draft's), and the node index of each (parent, rank) child kept in the tree."""

    tree: CandidateTree
    pick: list[int] = field(default_factory=list)
    child: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def drafted(self) -> bool:
        return len(self.pick) > 1


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


def propose(rng: random.Random, model: AcceptanceModel, depth: int, width: int, category: str | None,
            truth: Sequence[int] = ()) -> Proposal:
    """`truth`: the request's next true tokens where known; the drafted nodes the target will take get
    them, so a copy that agrees with the draft merges into its node as in the engine (lookup.graft)."""
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
            p.tree.tokens.append(drafted_token(idx))
            p.tree.parents.append(j)
            p.tree.scores.append(-neg)
            p.tree.draft_region.append(-1)
            p.tree.origin.append(None)
            p.pick.append(-1)
            p.child[(j, k)] = idx
            level.append(idx)
    node = 0
    for token in truth:  # down the picks from the root: the path the target takes
        node = p.child.get((node, p.pick[node])) if p.pick[node] >= 0 else None
        if node is None:
            break
        p.tree.tokens[node] = token
    return p


def accepted_path(selected: TokenTree, cand: CandidateTree | None, p: Proposal | None,
                  truth: Sequence[int]) -> list[int]:
    """Indices in `selected` (chosen from `cand`) of the root and the nodes the target accepts after it:
    the longest path from the root whose every node it takes. A drafted node is taken where the
    proposal's hidden pick says; a copied one (prompt lookup's, the suffix index's), or a drafted one
    given its true token (propose), where its token is the target's true token at its depth (`truth`:
    the request's next true tokens)."""
    if cand is None:
        return [0]
    where = {c: i for i, c in enumerate(selected.source)}
    children: dict[int, list[int]] = {}
    for c in selected.source[1:]:
        children.setdefault(cand.parents[c], []).append(c)

    def taken(c: int, depth: int) -> bool:
        node = drafted_node(cand.tokens[c])
        if node is None:
            return depth <= len(truth) and cand.tokens[c] == truth[depth - 1]
        parent = drafted_node(cand.tokens[cand.parents[c]]) if cand.parents[c] else 0
        return p is not None and parent is not None and p.pick[parent] >= 0 and p.child.get((parent,
                                                                                             p.pick[parent])) == node

    best: list[int] = [0]
    stack = [[0]]
    while stack:
        path = stack.pop()
        if len(path) > len(best):
            best = path
        stack += [path + [c] for c in children.get(path[-1], ()) if taken(c, len(path))]
    return [where[c] for c in best]


def accept(p: Proposal, selected: TokenTree) -> int:
    """Accepted draft tokens of `selected`, a tree chosen from the proposal's own (no copies)."""
    return len(accepted_path(selected, p.tree, p, ())) - 1
