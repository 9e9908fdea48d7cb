"""One request's parse state under its grammar, and the token masks it gives.

The state has consumed exactly the request's output: each token is fed as it is chosen (verification
walks an accepted path node by node, so a rejected draft is never fed and nothing rolls back). What
speculation asks of it is read from copies (`child`) or in one call over a whole tree (`tree_allows`),
which leave it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")
CLOSING_TOKENS = 48  # the last this many tokens of max_tokens close the answer (a third of a short one)


@dataclass(frozen=True)
class Closing:
    """How an answer closes before max_tokens cuts it: within the last CLOSING_TOKENS, of the tokens the
    grammar allows, only those of the first class with any (packed masks [1, W]; compiler.closing_classes),
    else all it allows. Inside free text (a string: most of the vocabulary allowed) a bracket is text, so
    the quote that ends the string comes first; elsewhere brackets and braces do. A string ends, an array
    ends, the object's required fields come as the grammar dictates, and the stop token as soon as the
    grammar is complete: the answer parses, where a cut one would not (reported as finish_reason length
    all the same, where the narrowing changed what was allowed)."""

    stops: torch.Tensor
    brackets: torch.Tensor
    quoted: torch.Tensor  # a quote, then only brackets and braces
    commas: torch.Tensor

    def narrow(self, mask: torch.Tensor) -> torch.Tensor | None:
        free_text = int(allowed(mask, mask.shape[1] * 32).sum()) > mask.shape[1] * 16
        order = ((self.stops, self.quoted, self.commas) if free_text
                 else (self.stops, self.brackets, self.quoted, self.commas))
        for c in order:
            narrowed = mask & c
            if bool(narrowed.any()):
                return narrowed
        return None


class GrammarState:
    def __init__(self, compiled, vocab_size: int, matcher=None, left: int | None = None,
                 closing: Closing | None = None) -> None:
        """`left`: output tokens still allowed, this one included (None: no closing)."""
        import xgrammar as xgr

        self.vocab_size, self.left, self.closing = vocab_size, left, closing
        self.window = min(CLOSING_TOKENS, left // 3) if left is not None else 0
        self.closed = False  # a chosen token's mask was narrowed to close the answer
        self._narrowed = False  # ... the last mask read was
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
        if self.left is not None:
            self.closed |= self._narrowed
            self.left -= 1

    def child(self, token: int) -> GrammarState | None:
        """The state after `token` (None where the grammar forbids it), this one left as it is."""
        if self.done:
            return None
        fork = self._matcher.fork()
        if not fork.accept_token(token):
            return None
        child = GrammarState(None, self.vocab_size, fork, None, self.closing)
        if self.left is not None:
            child.left, child.window = self.left - 1, self.window
        return child

    def bitmask(self) -> torch.Tensor:
        """The next token's allowed set, as 32-token words [1, W] (narrowed to close the answer within
        the last CLOSING_TOKENS of max_tokens)."""
        mask = forbidden(self.vocab_size)
        self._narrowed = False
        if self.done:
            return mask
        self._matcher.fill_next_token_bitmask(mask)
        if self.closing is not None and self.left is not None and self.left <= self.window:
            narrowed = self.closing.narrow(mask)
            if narrowed is not None and not torch.equal(narrowed, mask):
                self._narrowed, mask = True, narrowed
        return mask

    def tree_allows(self, tokens: list[int], parents: list[int]) -> list[bool]:
        """For a token tree rooted at the last token fed: whether each node is allowed (its token by its
        parent's mask, and its parent allowed), from every node's mask filled in one call."""
        n = len(tokens)
        if self.done:
            return [True] + [False] * (n - 1)
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
        return allows(masks, tokens, parents)


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


def pack(keep: torch.Tensor) -> torch.Tensor:
    """Booleans [vocab] as a mask [1, W] of 32-token words (token i: bit i % 32 of word i // 32)."""
    words = forbidden(keep.shape[0]).shape[1]
    bits = torch.zeros(words * 32, dtype=torch.int64)
    bits[: keep.shape[0]] = keep.long()
    packed = (bits.view(words, 32) << torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32).unsqueeze(0)


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
    keep = allowed(bitmask, rows.shape[-1])  # [1, V] broadcasts over the rows
    return rows.masked_fill(~keep.to(rows.device), NEG_INF).reshape(logits.shape)
