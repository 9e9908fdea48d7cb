"""The pool of physical KV blocks: which are free, who holds each, and (with prefix caching) which
full blocks hold a known token prefix.

Automatic prefix caching, as vLLM's and SGLang's radix cache do it: a full, committed block is known
by a key that chains the keys of the blocks before it with its own tokens, so equal keys mean equal
whole prefixes. Requests share such blocks read-only (a reference count each); a block nobody holds
stays cached, *idle*, until a new allocation needs it, oldest idle first (LRU). Only committed
tokens are ever keyed: a speculative tree or a prefill chunk in flight never enters the cache.

A cached block may carry a payload: what a reader of the prefix needs besides its KV (a
feature-conditioned draft needs the target's feature of the block's last position).

A request with a cache scope (Request.cache_scope: an isolated tenant's) chains its first block from
its scope's own root instead of ROOT_KEY, as vLLM's `cache_salt` does: its keys then differ from every
other scope's for the same tokens, so it neither finds nor leaves blocks another scope can find, while
requests without a scope key exactly as before.
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache

ROOT_KEY = b""


@lru_cache(maxsize=1024)
def scope_root(cache_scope: str | None) -> bytes:
    """What a scope's first block chains from: ROOT_KEY without a scope, else a digest of the scope
    (of a block key's length, under its own personalization, so it equals no key of any tokens)."""
    if cache_scope is None:
        return ROOT_KEY
    return hashlib.blake2b(cache_scope.encode(), digest_size=16, person=b"adaserve-scope").digest()


def block_key(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a block holding `tokens` after the prefix whose last block's key is `prev`
    (ROOT_KEY for the first block). 128-bit BLAKE2b: a collision would serve another prefix's KV."""
    return hashlib.blake2b(prev + array("q", tokens).tobytes(), digest_size=16).digest()


def extend_keys(keys: list[bytes], tokens: Sequence[int], block_size: int, num_blocks: int,
                root: bytes = ROOT_KEY) -> list[bytes]:
    """`keys`, the keys of the first full blocks of `tokens`, extended in place to `num_blocks` blocks
    (a token list only grows, so keys once computed stay valid). `root`: what the first block chains
    from (scope_root)."""
    for i in range(len(keys), num_blocks):
        keys.append(block_key(keys[-1] if keys else root, tokens[i * block_size : (i + 1) * block_size]))
    return keys


class BlockPool:
    def __init__(self, num_blocks: int, caching: bool = False) -> None:
        self.caching = caching
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._refs = [0] * num_blocks
        self._idle: OrderedDict[int, None] = OrderedDict()  # cached and unreferenced, least recently used first
        self._by_key: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._payload: dict[int, object] = {}

    @property
    def num_free(self) -> int:
        """Blocks an allocation can have: free ones and idle cached ones (evicted on demand)."""
        return len(self._free) + len(self._idle)

    @property
    def num_cached(self) -> int:
        return len(self._by_key)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def take(self) -> int:
        """A block for new writes, held once: a free one, else the least recently used idle one."""
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._idle.popitem(last=False)
            del self._by_key[self._key_of.pop(block)]
            self._payload.pop(block, None)
        self._refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of a cached block (an idle one is no longer evictable)."""
        if self._refs[block] == 0:
            del self._idle[block]
        self._refs[block] += 1

    def release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] < 0:
            raise AssertionError(f"block {block} released more often than held")
        if self._refs[block] == 0:
            if block in self._key_of:
                self._idle[block] = None
            else:
                self._free.append(block)

    def publish(self, block: int, key: bytes, payload: object = None) -> None:
        """Make a full, committed block findable by its key (a prefix already cached keeps its block)."""
        if self.caching and key not in self._by_key and block not in self._key_of:
            self._by_key[key] = block
            self._key_of[block] = key
            if payload is not None:
                self._payload[block] = payload

    def recent_keys(self, limit: int) -> list[bytes]:
        """The keys of the `limit` blocks cached most recently, newest first."""
        return list(itertools.islice(reversed(self._by_key), limit))

    def lookup(self, key: bytes) -> int | None:
        return self._by_key.get(key)

    def payload(self, block: int) -> object:
        return self._payload.get(block)
