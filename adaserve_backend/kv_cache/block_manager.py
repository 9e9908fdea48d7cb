"""Paged KV cache bookkeeping: fixed-size blocks, a free list, one block table per sequence.

A sequence's slots hold, in order, its *committed* tokens (part of its real history) followed by an
*uncommitted region*: tokens written speculatively this iteration (a chunk being prefilled, a draft
beam, a token tree under verification). Each region token records its parent inside the region (-1:
it hangs directly off the committed prefix), so attention can tell which region tokens a query may
see. `commit` keeps one root-to-node path of the region, moves it right after the committed prefix
and releases everything else.

Who allocates: in the engine the scheduler owns the blocks (`scheduled()`): it reserves each
iteration's worst case before anything runs (`reserve`), frees what a commit left unused (`trim`) and
what a finished or preempted request held (`free`); the runner only writes into reserved blocks and
commits. A runner used alone (tools, tests) lets `append` take the blocks it needs.

Prefix caching (block_pool.py): `publish` keys a sequence's full committed blocks by their tokens,
`match` finds the longest cached prefix of a token list and `attach` starts a new sequence on those
blocks, shared read-only: a sequence only ever writes past its committed tokens, so a full committed
block is never written again.

Check-then-act: `can_append` answers whether an append fits; `append` either succeeds completely or
raises `KVCacheFull` without changing any state. Pure Python; the tensor side lives in `kv_cache.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .block_pool import ROOT_KEY, BlockPool, extend_keys


class KVCacheFull(RuntimeError):
    """Not enough free blocks: the scheduler should queue or preempt, nothing is corrupted."""


@dataclass
class SequenceSlots:
    block_table: list[int] = field(default_factory=list)
    num_committed: int = 0
    region_parents: list[int] = field(default_factory=list)
    region_depths: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its first full committed blocks

    @property
    def num_slots(self) -> int:
        return self.num_committed + len(self.region_parents)


def chain_parents(region_len: int, n: int) -> list[int]:
    """Parents for `n` tokens appended as a chain after a region of `region_len` tokens."""
    return list(range(region_len - 1, region_len + n - 1))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, prefix_caching)
        self._seqs: dict[int, SequenceSlots] = {}
        self.scheduler_owned = False  # True: only reserve() allocates, commits leave trimming to trim()

    def scheduled(self) -> BlockManager:
        """Hand allocation to a scheduler: from now on appends must fit blocks it reserved."""
        self.scheduler_owned = True
        return self

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def prefix_caching(self) -> bool:
        return self.pool.caching

    def has(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def seq(self, seq_id: int) -> SequenceSlots:
        return self._seqs[seq_id]

    def num_committed(self, seq_id: int) -> int:
        """Tokens committed for the sequence; 0 for one the cache does not hold (yet)."""
        s = self._seqs.get(seq_id)
        return s.num_committed if s else 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks_needed(self, seq_id: int, n_new: int) -> int:
        s = self._seqs.get(seq_id)
        used, have = (s.num_slots, len(s.block_table)) if s else (0, 0)
        return max(0, self.blocks_for(used + n_new) - have)

    def can_append(self, seq_id: int, n_new: int) -> bool:
        need = self.extra_blocks_needed(seq_id, n_new)
        return need == 0 or (not self.scheduler_owned and need <= self.num_free_blocks)

    def table(self, seq_id: int) -> tuple[int, ...]:
        s = self._seqs.get(seq_id)
        return tuple(s.block_table) if s else ()

    def check_parents(self, seq_id: int, parents: Sequence[int]) -> None:
        base = len(self._seqs[seq_id].region_parents) if seq_id in self._seqs else 0
        for i, p in enumerate(parents):
            if not -1 <= p < base + i:
                raise ValueError(f"parent {p} of region token {base + i} must be -1 or an earlier token")

    def depths_after(self, seq_id: int, parents: Sequence[int]) -> list[int]:
        """Depths (position offsets past the committed prefix) that tokens with these parents get."""
        depths = list(self._seqs[seq_id].region_depths) if seq_id in self._seqs else []
        for p in parents:
            depths.append(0 if p < 0 else depths[p] + 1)
        return depths[len(depths) - len(parents) :]

    def slot(self, seq: SequenceSlots, index: int) -> int:
        return seq.block_table[index // self.block_size] * self.block_size + index % self.block_size

    # ---- actions -------------------------------------------------------------------------------
    def reserve(self, seq_id: int, n_new: int) -> None:
        """Grow the sequence's block table to hold `n_new` more tokens (creating it if new)."""
        need = self.extra_blocks_needed(seq_id, n_new)
        if need > self.num_free_blocks:
            raise KVCacheFull(f"sequence {seq_id} needs {need} blocks, {self.num_free_blocks} free")
        s = self._seqs.setdefault(seq_id, SequenceSlots())
        for _ in range(need):
            s.block_table.append(self.pool.take())

    def append(self, seq_id: int, parents: Sequence[int]) -> list[int]:
        """Append len(parents) region tokens; returns their slot ids. Creates the sequence if new."""
        self.check_parents(seq_id, parents)
        if self.scheduler_owned and self.extra_blocks_needed(seq_id, len(parents)):
            raise KVCacheFull(f"sequence {seq_id}: {len(parents)} tokens past the blocks its scheduler reserved")
        self.reserve(seq_id, len(parents))
        s = self._seqs[seq_id]
        first = s.num_slots
        s.region_depths.extend(self.depths_after(seq_id, parents))
        s.region_parents.extend(parents)
        return [self.slot(s, i) for i in range(first, first + len(parents))]

    def commit(self, seq_id: int, keep: Sequence[int]) -> tuple[list[int], list[int]]:
        """Keep region tokens `keep` (a path from the prefix down: keep[0] has parent -1 and each next
        one is the child of the previous), drop the rest of the region, free surplus blocks.

        Returns (src, dst) slot lists: the KV entries to move so the kept path sits contiguously after
        the committed prefix. Path indices only grow, so copying in order never clobbers a source.
        """
        s = self._seqs[seq_id]
        prev = -1
        for k in keep:
            if not 0 <= k < len(s.region_parents) or s.region_parents[k] != prev:
                raise ValueError(f"keep={list(keep)} is not a path from the committed prefix")
            prev = k
        src, dst = [], []
        for j, k in enumerate(keep):
            if k != j:
                src.append(self.slot(s, s.num_committed + k))
                dst.append(self.slot(s, s.num_committed + j))
        s.num_committed += len(keep)
        s.region_parents.clear()
        s.region_depths.clear()
        if not self.scheduler_owned:
            self._release_tail(s)
        return src, dst

    def commit_all(self, seq_id: int) -> None:
        """Commit a region that is a single chain (prefill chunks, plain decode)."""
        src, _ = self.commit(seq_id, range(len(self._seqs[seq_id].region_parents)))
        assert not src

    def trim(self, seq_id: int) -> None:
        """Free the blocks past the sequence's slots (what a reservation held for rejected drafts)."""
        if seq_id in self._seqs:
            self._release_tail(self._seqs[seq_id])

    def free(self, seq_id: int) -> None:
        s = self._seqs.pop(seq_id, None)
        if s is not None:
            for block in reversed(s.block_table):
                self.pool.release(block)

    def _release_tail(self, s: SequenceSlots) -> None:
        while len(s.block_table) > self.blocks_for(s.num_slots):
            self.pool.release(s.block_table.pop())

    # ---- prefix caching ------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], max_tokens: int, keys: list[bytes] | None = None,
              root: bytes = ROOT_KEY) -> tuple[list[int], list[bytes]]:
        """The cached blocks (and their keys) holding the longest prefix of `tokens`, in whole blocks
        of at most `max_tokens` tokens. `keys`: the tokens' block keys known so far (extended in place,
        so a caller that keeps them hashes each block once); `root`: the request's scope_root."""
        if not self.prefix_caching:
            return [], []
        n = min(max_tokens, len(tokens)) // self.block_size
        keys = extend_keys(keys if keys is not None else [], tokens, self.block_size, n, root)
        blocks = []
        for key in keys[:n]:
            block = self.pool.lookup(key)
            if block is None:
                break
            blocks.append(block)
        return blocks, keys[: len(blocks)]

    def recent_keys(self, limit: int) -> list[bytes]:
        """The keys of the `limit` blocks cached most recently (what a router is told this cache holds)."""
        return self.pool.recent_keys(limit)

    def attach(self, seq_id: int, blocks: Sequence[int], keys: Sequence[bytes]) -> None:
        """Start a sequence the cache does not hold yet on matched blocks, committed and shared."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already holds blocks")
        for block in blocks:
            self.pool.share(block)
        self._seqs[seq_id] = SequenceSlots(list(blocks), len(blocks) * self.block_size, keys=list(keys))

    def publish(self, seq_id: int, tokens: Sequence[int], payload_of: Callable[[int], object] | None = None,
                root: bytes = ROOT_KEY) -> None:
        """Key the sequence's full committed blocks not keyed yet (`tokens`: at least its committed
        ones) and cache them; with `payload_of`, a block whose payload is None is keyed, not cached.
        `root`: the request's scope_root (the one it was matched with)."""
        s = self._seqs.get(seq_id)
        if s is None or not self.prefix_caching:
            return
        first = len(s.keys)
        extend_keys(s.keys, tokens, self.block_size, s.num_committed // self.block_size, root)
        for i in range(first, len(s.keys)):
            payload = payload_of(i) if payload_of is not None else None
            if payload_of is None or payload is not None:
                self.pool.publish(s.block_table[i], s.keys[i], payload)

    def cached_payload(self, seq_id: int, block_index: int) -> object:
        return self.pool.payload(self._seqs[seq_id].block_table[block_index])
