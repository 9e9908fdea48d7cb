"""Prompt lookup: draft tokens copied from the request's own context, grafted onto the draft's tree.

The target often repeats what its context holds (names from a prompt's code, phrases of a document it
summarises, its own earlier lines). Where the last n tokens occurred before, the tokens that followed
that occurrence are a free proposal (no draft forward); where the draft's beam already holds them,
they only raise those nodes' scores. Verification is exact whatever a tree holds (acceptance.py), so
this changes how many tokens an iteration yields, never which.

After prompt lookup decoding (Saxena 2023) and vLLM's n-gram proposer: the longest suffix of at most
`max_n` tokens that occurred earlier, its most recent occurrence. (A second copy, from the latest
occurrence followed by a different token, never paid: docs/speculation.md#prompt-lookup-lookuppy.) The priors
hold for matches of up to MAX_NGRAM tokens: a shorter limit files longer matches under shorter n-grams.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import LOOKUP_MAX_NGRAM
from .token_tree import CandidateTree

# P(the target emits a copied token | it emitted the copied ones before it), by the length of the
# matched suffix (1-5 tokens) and the token's place in the copy (0, 1, 2, 3+): priors taken from the
# target's continuations of draft training prompts, never from benchmark prompts, so they do not flatter
# the benchmark (`python -m tools.draft.lookup_rates --max-n 5`; evidence:
# docs/speculation.md#prompt-lookup-lookuppy). The longer the match, the likelier the copy is right.
HIT_RATE = {
    5: (0.87, 0.89, 0.90, 0.91),
    4: (0.72, 0.78, 0.82, 0.81),
    3: (0.65, 0.72, 0.78, 0.82),
    2: (0.55, 0.66, 0.73, 0.78),
    1: (0.21, 0.57, 0.68, 0.71),
}
MAX_NGRAM = max(HIT_RATE)  # the longest match with a measured prior
if MAX_NGRAM != LOOKUP_MAX_NGRAM:
    raise ImportError("config's longest lookup match must be the longest this module has priors for")


class NgramIndex:
    """A growing token list's n-grams (n <= max_n), each mapped to where its latest occurrence that is
    followed by a token ends; updated incrementally as tokens are appended."""

    def __init__(self, max_n: int) -> None:
        if max_n < 1:  # serving keeps to MAX_NGRAM (config); measuring priors may look further
            raise ValueError(f"lookup n-grams must be at least 1 token, got {max_n}")
        self.max_n = max_n
        self._next: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # tokens[:_indexed] are indexed (each n-gram ending before _indexed - 1)

    def propose(self, tokens: Sequence[int], k: int) -> tuple[list[int], list[float]]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix,
        and each one's conditional acceptance probability (HIT_RATE); ([], []) if none."""
        n, copied = self.match(tokens, k)
        rates = HIT_RATE.get(n, ())
        return copied, [rates[min(i, len(rates) - 1)] for i in range(len(copied))]

    def match(self, tokens: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(n, up to k tokens that followed the latest earlier occurrence of the last n tokens) for the
        longest such n, (0, []) if none; `tokens` is the indexed list, grown or not since the last call."""
        if len(tokens) < self._indexed:  # not the list this index was built on
            self._next.clear()
            self._indexed = 0
        for end in range(max(self._indexed, 1), len(tokens)):  # n-grams ending at end - 1, followed by tokens[end]
            for n in range(1, min(self.max_n, end) + 1):
                self._next[tuple(tokens[end - n : end])] = end
        self._indexed = len(tokens)
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            end = self._next.get(tuple(tokens[len(tokens) - n :]))
            if end is not None:
                return n, list(tokens[end : end + k])
        return 0, []


def graft(tree: CandidateTree, tokens: Sequence[int], conditional: Sequence[float],
          parents: Sequence[int] | None = None, origins: Sequence | None = None) -> None:
    """Add proposed nodes below the root: a chain, or a tree whose `parents` index the proposal (-1: the
    root; parents first). Where a node already holds the token it is followed (its score raised to the
    proposal's if lower, its origin then the proposal's), else a new node is appended (never read by
    the draft). A node's path score continues from the higher of the two, so scores still never grow
    from parent to child, and the list stays in topological order (levels may no longer be contiguous)."""
    child_of = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens)) if p >= 0}
    placed: list[int] = []  # proposal node -> tree node
    for i, (token, p) in enumerate(zip(tokens, conditional)):
        parent = (i - 1 if parents is None else parents[i])
        node = 0 if parent < 0 else placed[parent]
        score = tree.scores[node] * p
        origin = origins[i] if origins is not None else None
        child = child_of.get((node, token))
        if child is None:
            child = child_of[(node, token)] = len(tree.tokens)
            tree.tokens.append(token)
            tree.parents.append(node)
            tree.scores.append(score)
            tree.draft_region.append(-1)
            tree.origin.append(origin)
        elif score > tree.scores[child]:
            tree.scores[child], tree.origin[child] = score, origin
        placed.append(child)
