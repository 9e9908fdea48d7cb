"""Prompt lookup: draft tokens copied from the request's own context, grafted onto the draft's tree.

The target often repeats what its context holds (names from a prompt's code, phrases of a document it
summarises, its own earlier lines). Where the last n tokens occurred before, the tokens that followed
that occurrence are a free proposal (no draft forward); where the draft's beam already holds them,
they only raise those nodes' scores. Verification is exact whatever a tree holds (acceptance.py), so
this changes how many tokens an iteration yields, never which.

After prompt lookup decoding (Saxena 2023) and vLLM's n-gram proposer: the longest suffix of at most
`max_n` tokens that occurred earlier, its most recent occurrence; optionally (copies=2) also a second
copy from the latest occurrence followed by a different token, as a sibling branch. The priors hold
for matches of up to MAX_NGRAM tokens: a shorter limit files longer matches under shorter n-grams.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import LOOKUP_MAX_COPIES, LOOKUP_MAX_NGRAM
from .token_tree import CandidateTree

# P(the target emits a copied token | it emitted the copied ones before it), by the length of the
# matched suffix (1-5 tokens) and the token's place in the copy (0, 1, 2, 3+): priors taken from the
# target's continuations of draft training prompts, never from benchmark prompts, so they do not flatter
# the benchmark (`python -m tools.draft.lookup_rates --max-n 5`; evidence:
# docs/experiments.md#lookup-variants). The longer the match, the likelier the copy is right.
HIT_RATE = {
    5: (0.87, 0.89, 0.90, 0.91),
    4: (0.72, 0.78, 0.82, 0.81),
    3: (0.65, 0.72, 0.78, 0.82),
    2: (0.55, 0.66, 0.73, 0.78),
    1: (0.21, 0.57, 0.68, 0.71),
}
# The same for the second copy: what followed the latest earlier occurrence whose next token differs
# from the first copy's (its first token can be right only where the first copy's is wrong).
SECOND_RATE = {
    5: (0.26, 0.83, 0.87, 0.87),
    4: (0.26, 0.64, 0.89, 0.94),
    3: (0.17, 0.60, 0.67, 0.83),
    2: (0.18, 0.57, 0.69, 0.78),
    1: (0.12, 0.54, 0.65, 0.73),
}
RATES = (HIT_RATE, SECOND_RATE)  # by the copy's rank
MAX_NGRAM = max(HIT_RATE)  # the longest match with a measured prior
MAX_COPIES = len(RATES)
if (MAX_NGRAM, MAX_COPIES) != (LOOKUP_MAX_NGRAM, LOOKUP_MAX_COPIES):
    raise ImportError("config's lookup limits must be the matches and copies this module has priors for")


class NgramIndex:
    """A growing token list's n-grams (n <= max_n), each mapped to where its latest occurrences that
    are followed by a token end (up to `copies` of them, each followed by a different token, most
    recent first); updated incrementally as tokens are appended."""

    def __init__(self, max_n: int, copies: int = 1) -> None:
        if max_n < 1:  # serving keeps to MAX_NGRAM (config); measuring priors may look further
            raise ValueError(f"lookup n-grams must be at least 1 token, got {max_n}")
        if not 1 <= copies <= MAX_COPIES:
            raise ValueError(f"lookup copies must be 1..{MAX_COPIES}, got {copies}")
        self.max_n, self.copies = max_n, copies
        self._next: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # tokens[:_indexed] are indexed (each n-gram ending before _indexed - 1)

    def propose(self, tokens: Sequence[int], k: int) -> list[tuple[list[int], list[float]]]:
        """Per copy (most recent first): up to k tokens that followed an earlier occurrence of the
        longest matching suffix, and each one's conditional acceptance probability (RATES)."""
        n, copies = self.match(tokens, k)
        out = []
        for rank, copied in enumerate(copies):
            rates = RATES[rank].get(n, ())
            out.append((copied, [rates[min(i, len(rates) - 1)] for i in range(len(copied))]))
        return out

    def match(self, tokens: Sequence[int], k: int) -> tuple[int, list[list[int]]]:
        """(n, up to `copies` lists of up to k tokens that followed earlier occurrences of the last n
        tokens) for the longest such n, (0, []) if none; `tokens` is the indexed list, grown or not
        since the last call."""
        if len(tokens) < self._indexed:  # not the list this index was built on
            self._next.clear()
            self._indexed = 0
        for end in range(max(self._indexed, 1), len(tokens)):  # n-grams ending at end - 1, followed by tokens[end]
            for n in range(1, min(self.max_n, end) + 1):
                key = tuple(tokens[end - n : end])
                others = [e for e in self._next.get(key, ()) if tokens[e] != tokens[end]]
                self._next[key] = [end] + others[: self.copies - 1]
        self._indexed = len(tokens)
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            ends = self._next.get(tuple(tokens[len(tokens) - n :]))
            if ends is not None:
                return n, [list(tokens[e : e + k]) for e in ends]
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
