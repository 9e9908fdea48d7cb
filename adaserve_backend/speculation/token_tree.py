"""Token trees as plain data: node 0 is the root (the request's last token, not yet in the target's KV
cache); every other node's parent comes before it, so a list order is a topological order."""

from __future__ import annotations

from dataclasses import dataclass, field


def depths(parents: list[int]) -> list[int]:
    """Each node's depth below the root, for parents listed before their children."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


@dataclass
class CandidateTree:
    """One request's beam-search result.

    scores: the draft's path probability of each node (product of conditional probabilities along the
      root-to-node path); the root's is 1.0. Scores never increase from a parent to a child.
    draft_region: for each node, its index in the draft model's uncommitted KV region, or -1 when the
      draft never processed it (the deepest level): what to keep in the draft cache after acceptance.
    origin: for each node, the bucket of the suffix index's proposal that gave its score
      (copy_rates.py), None for the draft's nodes and prompt lookup's: what verification teaches.
    """

    tokens: list[int]
    parents: list[int]
    scores: list[float]
    draft_region: list[int] = field(default_factory=list)
    origin: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.origin:
            self.origin = [None] * len(self.tokens)

    @classmethod
    def root_only(cls, token: int) -> "CandidateTree":
        """No drafts: the root (the token being decoded) alone, never read by the draft."""
        return cls([token], [-1], [1.0], [-1], [None])

    def __len__(self) -> int:
        return len(self.tokens)

    def height(self) -> int:
        """The most drafts one verification of this tree can accept (its deepest node's depth)."""
        return max(depths(self.parents))


@dataclass(frozen=True)
class TokenTree:
    """A selected (draft) token tree, sent to the target for verification."""

    tokens: list[int]
    parents: list[int]  # indices into this tree; -1 for the root
    source: list[int]  # index of each node in the candidate tree it came from

    @classmethod
    def from_selection(cls, cand: CandidateTree, nodes: list[int]) -> "TokenTree":
        nodes = sorted(nodes)  # candidate order is topological, so sorted selection is too
        where = {c: i for i, c in enumerate(nodes)}
        parents = [-1 if cand.parents[c] < 0 else where[cand.parents[c]] for c in nodes]
        return cls([cand.tokens[c] for c in nodes], parents, nodes)

    @classmethod
    def chain(cls, tokens: list[int]) -> "TokenTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), list(range(len(tokens))))

    def depths(self) -> list[int]:
        return depths(self.parents)

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p].append(i)
        return kids


def truncate_depth(cand: CandidateTree, max_depth: int) -> None:
    """Drop nodes deeper than `max_depth` (a grafted chain may sit after deeper beam levels, so nodes
    are filtered, not cut at the first deep one; parents come first, so indices remap in one pass)."""
    depth = depths(cand.parents)
    if max(depth) <= max_depth:
        return
    keep_nodes(cand, [i for i, d in enumerate(depth) if d <= max_depth])


def keep_nodes(cand: CandidateTree, keep: list[int]) -> None:
    """Keep only these nodes (in order, the root and each kept node's parent among them)."""
    where = {old: new for new, old in enumerate(keep)}
    cand.tokens[:] = [cand.tokens[i] for i in keep]
    cand.parents[:] = [-1 if cand.parents[i] < 0 else where[cand.parents[i]] for i in keep]
    cand.scores[:] = [cand.scores[i] for i in keep]
    cand.draft_region[:] = [cand.draft_region[i] for i in keep]
    cand.origin[:] = [cand.origin[i] for i in keep]
