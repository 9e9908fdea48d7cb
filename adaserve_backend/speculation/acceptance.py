"""Tree verification: which path of a token tree the target accepts.

At the current node the target picks its own next token y (argmax when greedy, a sample from its
processed distribution otherwise). If a child carries y the walk moves to it; else y is the bonus
token and the walk stops. For sampling this is the lossless rule for deterministic draft trees: trying
children in turn, accepting child x with probability p(x) and renormalising p without x on rejection,
accepts each child with exactly its probability p(x) and otherwise emits a sample from p restricted to
non-children: the same law as drawing y ~ p once. Emitted tokens are therefore distributed exactly as
the target's own sampling, whatever the draft proposed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .token_tree import TokenTree


@dataclass(frozen=True)
class Acceptance:
    path: list[int]  # accepted tree nodes from the root (the root always)
    tokens: list[int]  # emitted tokens: the accepted draft tokens, then the bonus token

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.path) - 1


def accept(tree: TokenTree, target_token_at: Callable[[int], int]) -> Acceptance:
    """`target_token_at(node)`: the target's choice of the token following `node`."""
    children = tree.children()
    node, path, tokens = 0, [0], []
    while True:
        y = target_token_at(node)
        tokens.append(y)
        nxt = next((c for c in children[node] if tree.tokens[c] == y), None)
        if nxt is None:
            return Acceptance(path, tokens)
        node = nxt
        path.append(node)
