"""Fixed-size KV blocks handed to sessions, the bookkeeping of a paged KV cache.

A paged cache (vLLM's PagedAttention, Kwon et al. 2023, "Efficient Memory Management for
Large Language Model Serving with PagedAttention") stores every session's keys and
values in blocks of `block_size` positions drawn from one pool; a session owns a list
of block ids (its block table) and a length. Rolling a session back is only a shorter
length: entries past it are overwritten by the next tokens fed. Blocks no longer
covered by the length go back to the pool at once.

`BlockTable` is one session's view; `BlockPool` hands out ids and grows (doubling) when
it runs dry, calling `on_grow(old, new)` so the owner can enlarge its tensors. Blocks of
a table that is garbage-collected (a session evicted or dropped) return to the pool by
a finaliser, so no caller has to remember to free them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable


class BlockPool:
    def __init__(self, block_size: int, initial_blocks: int = 16, max_blocks: int = 0,
                 on_grow: Callable[[int, int], None] | None = None):
        if block_size < 1 or initial_blocks < 1:
            raise ValueError("block_size and initial_blocks must be >= 1")
        self.block_size = block_size
        self.max_blocks = max_blocks  # 0 = no limit
        self.on_grow = on_grow
        self.capacity = initial_blocks
        self._free = list(range(initial_blocks - 1, -1, -1))  # pop() gives the lowest id
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def take(self, n: int) -> list[int]:
        """n block ids; grows the pool (doubling) when too few are free."""
        with self._lock:
            if len(self._free) < n:
                self._grow(n - len(self._free))
            return [self._free.pop() for _ in range(n)]

    def give_back(self, ids: list[int]) -> None:
        with self._lock:
            self._free.extend(reversed(ids))

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
        self.capacity = new


class BlockTable:
    """One session's blocks and its logical length (what it holds)."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.length = 0
        self.blocks: list[int] = []
        # The list object outlives nothing: when the table goes, its blocks go back.
        weakref.finalize(self, pool.give_back, self.blocks)

    def reserve(self, positions: int) -> None:
        """Own enough blocks for `positions` positions (the length is unchanged)."""
        need = self.pool.blocks_for(positions) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.take(need))

    def crop(self, length: int) -> None:
        """Forget positions >= length; blocks past the new length return to the pool."""
        if length >= self.length:
            return
        self.length = length
        keep = self.pool.blocks_for(length)
        if keep < len(self.blocks):
            spare = self.blocks[keep:]
            del self.blocks[keep:]
            self.pool.give_back(spare)
