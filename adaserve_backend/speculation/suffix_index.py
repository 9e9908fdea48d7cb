"""Suffix speculation: continuations of what the server has already seen, across requests.

Traffic repeats itself across requests (a question asked again, templated answers, agents re-sending a
context), and what the target emitted before is free draft data. After SuffixDecoding (Arctic
Inference): every request's tokens (prompt, then output as it commits) are indexed by the n-grams they
contain; a decoding request's context is matched against all of them, and the tokens that followed the
longest matches become a small tree below its root, each branch with the share of occurrences that
took it. Verification is exact (acceptance.py), so the index changes how many tokens an iteration
yields, never which.

The index is bounded (`max_tokens` over all requests; the oldest finished request goes first) and
scoped: requests only match requests of the same scope (SpeculationConfig.suffix_scope), because the
time a request takes can reveal that its continuation was seen before, as with prefix caching.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

# Matches are found by their last KEY_LENGTHS[0] tokens or, where a longer key occurred, by its last
# KEY_LENGTHS[-1]: a frequent short key (the chat template's assistant header ends every prompt) keeps
# only its latest OCCURRENCES, so the same question asked long ago is found by the longer key.
KEY_LENGTHS = (4, 16)
OCCURRENCES = 8
MAX_MATCH = 64  # a match is measured back at most this far (its bucket saturates well before)
MIN_PATH = 0.05  # nodes whose path probability falls below this are not proposed


@dataclass
class Proposal:
    """A tree below a request's root: parents index this proposal (-1: the root); `conditional` is each
    node's probability given its parent; `keys` its bucket in the learnt rates (copy_rates.py)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    conditional: list[float] = field(default_factory=list)
    keys: list[Hashable] = field(default_factory=list)


def bucket(match: int, count: int, siblings_count: int, depth: int) -> tuple:
    """What a continuation token's acceptance depends on: how much context matched, how many of the
    matching occurrences agreed on it (unanimous twice or more, unanimous once, a majority, fewer),
    and its place in the continuation."""
    m = 0 if match < 8 else 1 if match < 16 else 2 if match < 32 else 3
    share = count / siblings_count
    s = (3 if count > 1 else 2) if share == 1.0 else 1 if share >= 0.5 else 0
    return ("suffix", m, s, min(depth, 3))


def prior(key: tuple) -> float:
    """The rate a bucket starts from before verification measured it: longer and more unanimous
    matches are likelier right (the learnt rates replace it within a few dozen verified nodes)."""
    _, m, s, _ = key
    return min((0.45, 0.6, 0.75, 0.85)[m] * (0.4, 0.8, 1.0, 1.1)[s], 0.95)


# The index holds hundreds of thousands of tokens for as long as the server runs, so it is stored
# compactly: a doc's tokens as machine ints (a list would keep an int object alive per token), and an
# occurrence as one int, `doc_id << POSITION_BITS | position`, alone where its key occurred once (most
# long keys) or in a list of such ints. A doc's entries go with it, so an id never points at another doc.
POSITION_BITS = 32


class _Doc:
    __slots__ = ("tokens", "scope", "finished")

    def __init__(self, scope: Hashable) -> None:
        self.tokens = array("i")
        self.scope = scope
        self.finished = False


def _keys(doc: _Doc, start: int):
    """(key hash, position after the key) of each key of `doc` followed by a token at `start` or later."""
    t = doc.tokens
    for e in range(max(start, 1), len(t)):  # position e follows the key ending at e - 1
        for k in KEY_LENGTHS:
            if e < k:
                break
            yield hash((doc.scope, *t[e - k : e])), e


class SuffixIndex:
    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"the suffix index must hold at least one token, got {max_tokens}")
        self.max_tokens = max_tokens
        self._docs: dict[int, _Doc] = {}  # by request, oldest first
        # key hash -> occurrence(s): (doc id, position after the key) packed, latest last
        self._where: dict[int, int | list[int]] = {}
        self._closed: set[int] = set()  # requests evicted while running: not indexed again
        self.num_tokens = 0

    def extend(self, doc_id: int, scope: Hashable, tokens: Sequence[int]) -> None:
        """Index the tokens of request `doc_id` beyond those already indexed (`tokens` only grows)."""
        if doc_id in self._closed:
            return
        doc = self._docs.get(doc_id)
        if doc is None:
            doc = self._docs[doc_id] = _Doc(scope)
        start = len(doc.tokens)
        doc.tokens.extend(tokens[start:])
        base, all_where = doc_id << POSITION_BITS, self._where
        for h, e in _keys(doc, start):
            where = all_where.get(h)
            if where is None:
                all_where[h] = base | e
            elif type(where) is int:
                all_where[h] = [where, base | e]
            else:
                where.append(base | e)
                if len(where) > OCCURRENCES:
                    del where[0]
        self.num_tokens += len(doc.tokens) - start
        while self.num_tokens > self.max_tokens:
            self._evict()

    def finish(self, doc_id: int) -> None:
        """The request ended: its tokens stay indexed until evicted, the oldest finished first."""
        self._closed.discard(doc_id)
        if doc_id in self._docs:
            self._docs[doc_id].finished = True

    def _evict(self) -> None:
        victim = next((i for i, d in self._docs.items() if d.finished), next(iter(self._docs)))
        doc = self._docs.pop(victim)
        if not doc.finished:
            self._closed.add(victim)
        for h, _ in _keys(doc, 0):
            where = self._where.get(h)
            if where is None:
                continue
            if type(where) is int:
                if where >> POSITION_BITS == victim:
                    del self._where[h]
                continue
            where[:] = [o for o in where if o >> POSITION_BITS != victim]
            if len(where) == 1:
                self._where[h] = where[0]
            elif not where:
                del self._where[h]
        self.num_tokens -= len(doc.tokens)

    def propose(self, scope: Hashable, context: Sequence[int], max_nodes: int,
                rate: Callable[[tuple], float]) -> Proposal:
        """Up to `max_nodes` tokens that followed the longest earlier matches of `context`'s end, as a
        tree, best path probabilities first; `rate(key)` the conditional probability of a bucket."""
        found = self._matches(scope, context)
        if not found or max_nodes < 1:
            return Proposal()
        # a trie of the continuations: per node its token, parent, occurrences through it, longest match
        tokens, parents, counts, matches, depth = [], [], [], [], []
        child: dict[tuple[int, int], int] = {}
        for m, doc, e in found:
            node = -1
            for tok in doc.tokens[e : e + max_nodes]:
                c = child.get((node, tok))
                if c is None:
                    c = child[(node, tok)] = len(tokens)
                    tokens.append(tok), parents.append(node), counts.append(0), matches.append(0)
                    depth.append(0 if node < 0 else depth[node] + 1)
                counts[c] += 1
                matches[c] = max(matches[c], m)
                node = c
        kids: dict[int, list[int]] = {}
        for c, p in enumerate(parents):
            kids.setdefault(p, []).append(c)
        out, where = Proposal(), {-1: -1}
        heap = []

        def push(p: int, path: float) -> None:
            total = len(found) if p < 0 else counts[p]
            for c in kids.get(p, ()):
                key = bucket(matches[c], counts[c], total, depth[c])
                q = rate(key)
                if path * q >= MIN_PATH:
                    heapq.heappush(heap, (-path * q, c, q, key))

        push(-1, 1.0)
        while heap and len(out.tokens) < max_nodes:
            neg, c, q, key = heapq.heappop(heap)
            where[c] = len(out.tokens)
            out.tokens.append(tokens[c]), out.parents.append(where[parents[c]])
            out.conditional.append(q), out.keys.append(key)
            push(c, -neg)
        return out

    def _matches(self, scope: Hashable, context: Sequence[int]) -> list[tuple[int, _Doc, int]]:
        """(match length, doc, position after the match) of the latest occurrences of the context's
        last KEY_LENGTHS[-1] tokens if any, else of its last KEY_LENGTHS[0]; each continues somewhere."""
        n = len(context)
        for k in reversed(KEY_LENGTHS):
            if n < k:
                continue
            where = self._where.get(hash((scope, *context[n - k :])))
            if where is None:
                continue
            found = []
            for doc, e in self.occurrences(where):
                t, m = doc.tokens, 0
                while m < MAX_MATCH and m < e and m < n and t[e - 1 - m] == context[n - 1 - m]:
                    m += 1
                if m >= k:  # else a hash collision
                    found.append((m, doc, e))
            if found:
                return found
        return []

    def occurrences(self, where: int | list[int]) -> Iterator[tuple[_Doc, int]]:
        """(doc, position after the key) of each occurrence packed in one `_where` value."""
        mask = (1 << POSITION_BITS) - 1
        for o in (where,) if type(where) is int else where:
            yield self._docs[o >> POSITION_BITS], o & mask
