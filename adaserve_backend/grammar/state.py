"""One request's parse state under its grammar, and the token masks it gives.

The state has consumed exactly the request's output: each token is fed as it is chosen (verification
walks an accepted path node by node, so a rejected draft is never fed and nothing rolls back). What
speculation asks of it is read from copies (`child`) or in one call over a whole tree (`tree_masks`),
which leave it as it is.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


class GrammarState:
    def __init__(self, compiled, vocab_size: int, matcher=None) -> None:
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self._matcher = matcher if matcher is not None else xgr.GrammarMatcher(compiled)
        self._words = xgr.get_bitmask_shape(1, vocab_size)[1]

    @property
    def done(self) -> bool:
        """The grammar has ended (its stop token was fed, which ends the request): nothing may follow."""
        return self._matcher.is_terminated()

    def accept(self, token: int) -> None:
        """Feed the token just chosen; a token the mask forbade is a bug here."""
        if self.done or not self._matcher.accept_token(token):
            raise RuntimeError(f"token {token} is not allowed by the request's grammar")

    def child(self, token: int) -> GrammarState | None:
        """The state after `token` (None where the grammar forbids it), this one left as it is."""
        if self.done:
            return None
        fork = self._matcher.fork()
        return GrammarState(None, self.vocab_size, fork) if fork.accept_token(token) else None

    def bitmask(self) -> torch.Tensor:
        """The next token's allowed set, as 32-token words [1, W]."""
        if self.done:
            return forbidden(self.vocab_size)
        mask = forbidden(self.vocab_size)
        self._matcher.fill_next_token_bitmask(mask)
        return mask

    def tree_masks(self, tokens: list[int], parents: list[int]) -> tuple[torch.Tensor, list[bool]]:
        """For a token tree rooted at the last token fed: each node's next-token mask [n, W] and whether
        the node itself is allowed (its token by its parent's mask, and its parent allowed), in one pass."""
        n = len(tokens)
        if self.done:
            return forbidden(self.vocab_size).expand(n, -1), [True] + [False] * (n - 1)
        first, sibling, last = [-1] * n, [-1] * n, {}
        for i in range(1, n):
            p = parents[i]
            if first[p] < 0:
                first[p] = i
            else:
                sibling[last[p]] = i
            last[p] = i
        masks = torch.zeros(n, self._words, dtype=torch.int32)
        self._matcher.traverse_draft_tree(torch.tensor(first), torch.tensor(sibling), torch.tensor(tokens), masks)
        bits = allows(masks, tokens, parents)
        return masks, bits


def allows(masks: torch.Tensor, tokens: list[int], parents: list[int]) -> list[bool]:
    """Whether each node's token is in its parent's mask (the root: always). A node under a forbidden
    one has an empty parent mask, so it is forbidden too."""
    ok = [True]
    for t, p in zip(tokens[1:], parents[1:]):
        ok.append(ok[p] and allows_token(masks[p : p + 1], t))
    return ok


def allows_token(bitmask: torch.Tensor, token: int) -> bool:
    """Whether a mask [1, W] allows the token."""
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)


def forbidden(vocab_size: int) -> torch.Tensor:
    """A mask [1, W] that allows nothing."""
    import xgrammar as xgr

    return torch.zeros(xgr.get_bitmask_shape(1, vocab_size), dtype=torch.int32)


def allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bit masks [n, W] as booleans [n, vocab]."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def masked(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Logits [V] or [n, V] with the tokens the mask forbids at -inf (a new tensor)."""
    rows = logits.reshape(-1, logits.shape[-1])
    keep = allowed(bitmask.expand(rows.shape[0], -1) if bitmask.shape[0] == 1 else bitmask, rows.shape[-1])
    return rows.masked_fill(~keep.to(rows.device), NEG_INF).reshape(logits.shape)
