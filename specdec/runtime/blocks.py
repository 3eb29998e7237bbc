"""Fixed-size KV blocks handed to sessions, the bookkeeping of a paged KV cache.

A paged cache (vLLM's PagedAttention, Kwon et al. 2023, "Efficient Memory Management for
Large Language Model Serving with PagedAttention") stores every session's keys and
values in blocks of `block_size` positions drawn from one pool; a session owns a list
of block ids (its block table) and a length. Rolling a session back is only a shorter
length: entries past it are overwritten by the next tokens fed. Blocks no longer
covered by the length go back to the pool at once.

Blocks are reference-counted: with automatic prefix caching (specdec.runtime.prefix_cache)
one full block can sit in several sessions' tables. A block whose count drops to 0 is
*free*, or, if the prefix cache indexed it (`register`), *cached*: still holding its
keys and values for a later session with the same prefix, and evictable, least
recently used first. `take` hands out free blocks first, then evicts cached ones
(telling the owner through `on_evict`), and only then grows the pool (doubling, up to
`max_blocks`), calling `on_grow(old, new)` so the owner can enlarge its tensors. A block
that is shared or indexed is never written: the writer copies it first
(`BlockTable.make_writable`, copy-on-write).

`BlockTable` is one session's view. Blocks of a table that is garbage-collected (a
session evicted or dropped) return to the pool by a finaliser, so no caller has to
remember to free them.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

from specdec.digest import TokenPrefix


class BlockPool:
    def __init__(self, block_size: int, initial_blocks: int = 16, max_blocks: int = 0,
                 on_grow: Callable[[int, int], None] | None = None):
        if block_size < 1 or initial_blocks < 1:
            raise ValueError("block_size and initial_blocks must be >= 1")
        self.block_size = block_size
        self.max_blocks = max_blocks  # 0 = no limit
        self.on_grow = on_grow
        self.on_evict: Callable[[int], None] | None = None  # a cached block is reused
        self.capacity = initial_blocks
        self.evictions = 0
        self._free = list(range(initial_blocks - 1, -1, -1))  # pop() gives the lowest id
        self._refs = [0] * initial_blocks
        self._cached: OrderedDict[int, None] = OrderedDict()  # count 0, indexed; LRU first
        self._registered: set[int] = set()
        # Reentrant: a table's finaliser may run (garbage collection) inside a pool call.
        self.lock = threading.RLock()

    @property
    def free(self) -> int:
        """Blocks a `take` can hand out without growing: free ones and cached ones."""
        with self.lock:
            return len(self._free) + len(self._cached)

    @property
    def cached(self) -> int:
        """Blocks no table holds that keep their contents for the prefix cache."""
        with self.lock:
            return len(self._cached)

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def refs(self, block: int) -> int:
        with self.lock:
            return self._refs[block]

    def take(self, n: int) -> list[int]:
        """n block ids, each held once: free ones first, then cached ones (least recently
        used first, evicted from the index), then the pool grows."""
        with self.lock:
            while len(self._free) < n and self._cached:
                self._evict()
            if len(self._free) < n:
                self._grow(n - len(self._free))
            ids = [self._free.pop() for _ in range(n)]
            for block in ids:
                self._refs[block] = 1
            return ids

    def share(self, block: int) -> None:
        """One more holder of `block` (a table attaching a cached prefix block)."""
        with self.lock:
            if self._refs[block] == 0:
                del self._cached[block]
            self._refs[block] += 1

    def give_back(self, ids: list[int]) -> None:
        """One holder fewer of each block; a block nobody holds is cached if indexed,
        else free."""
        with self.lock:
            for block in reversed(ids):
                self._refs[block] -= 1
                if self._refs[block] > 0:
                    continue
                if block in self._registered:
                    self._cached[block] = None
                    self._cached.move_to_end(block)
                else:
                    self._free.append(block)

    def register(self, block: int) -> None:
        """The prefix cache indexed `block`: keep its contents when nobody holds it."""
        with self.lock:
            self._registered.add(block)

    def needs_copy(self, block: int) -> bool:
        """Writing into `block` would change what another table or the index reads."""
        with self.lock:
            return self._refs[block] > 1 or block in self._registered

    def _evict(self) -> None:
        block, _ = self._cached.popitem(last=False)
        self._registered.discard(block)
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict(block)
        self._free.append(block)

    def _grow(self, short: int) -> None:
        new = max(self.capacity * 2, self.capacity + short)
        if self.max_blocks:
            new = min(new, self.max_blocks)
        if new - self.capacity < short:
            raise MemoryError(
                f"KV block pool is full ({self.capacity} blocks of {self.block_size} "
                "positions); release sessions or raise the server's KV budget")
        if self.on_grow is not None:
            self.on_grow(self.capacity, new)
        self._free = list(range(new - 1, self.capacity - 1, -1)) + self._free
        self._refs.extend([0] * (new - self.capacity))
        self.capacity = new


class BlockTable:
    """One session's blocks, its logical length (what it holds) and the token ids at
    those positions with their prefix digests (`held`, what the prefix cache keys on)."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.length = 0
        self.blocks: list[int] = []
        self.held = TokenPrefix()
        # The prefix cache's record of each full block (prefix_cache.BlockEntry), kept in
        # step with the length by the prefix cache; empty when it is off.
        self.entries: list = []
        # The list object outlives nothing: when the table goes, its blocks go back.
        weakref.finalize(self, pool.give_back, self.blocks)

    def reserve(self, positions: int) -> None:
        """Own enough blocks for `positions` positions (the length is unchanged)."""
        need = self.pool.blocks_for(positions) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.take(need))

    def advance(self, tokens: list[int]) -> None:
        """`tokens` were written after the length (their blocks reserved)."""
        self.length += len(tokens)
        self.held.extend(tokens)

    def place(self, index: int, block: int) -> None:
        """Put `block` (already held for this table) at `index`, giving back what was
        there."""
        if index == len(self.blocks):
            self.blocks.append(block)
            return
        old, self.blocks[index] = self.blocks[index], block
        self.pool.give_back([old])

    def make_writable(self, start: int, end: int, copy: Callable[[int, int], None]) -> int:
        """Copy-on-write: every block this table holds among those positions
        [start, end) fall in that is shared or indexed is replaced by a private copy
        (`copy(src, dst)` copies the contents). Returns how many were copied."""
        bs = self.pool.block_size
        copied = 0
        for index in range(start // bs, min(len(self.blocks), self.pool.blocks_for(end))):
            old = self.blocks[index]
            if self.pool.needs_copy(old):
                new = self.pool.take(1)[0]
                copy(old, new)
                self.place(index, new)
                copied += 1
        return copied

    def crop(self, length: int) -> None:
        """Forget positions >= length; blocks past the new length return to the pool."""
        if length >= self.length:
            return
        self.length = length
        self.held.truncate(length)
        del self.entries[length // self.pool.block_size:]
        keep = self.pool.blocks_for(length)
        if keep < len(self.blocks):
            spare = self.blocks[keep:]
            del self.blocks[keep:]
            self.pool.give_back(spare)
