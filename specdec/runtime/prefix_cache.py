"""Automatic prefix caching for the paged KV cache (docs/design.md, "Automatic prefix
caching"): a full block computed for one session serves every later session whose
tokens up to that block's end are the same.

The idea is vLLM's (its "automatic prefix caching" design): each full block is keyed by
a hash chain of every token up to its end; here the chain is the project's prefix
digest (specdec.digest), so the key of block j of a table is `held.digest_of((j+1)*bs)`.
The digests stay the truth only together with the tokens: an index entry also records
its block's own token ids and its parent entry (the block before it), and a block is
reused only when its tokens and, parent by parent, every token before them equal the
session's. A digest collision therefore costs a cache miss, never wrong keys and values.

Two steps around each forward pass (PagedOpenVINOBackend.forward_batch):

* `attach` (before): the longest run of indexed blocks continuing the session's prefix
  joins its block table (shared, reference-counted by the BlockPool) and its length moves
  past them; the caller feeds only the rest. It never serves a position whose logits the
  caller asked for: at most `len(tokens) - keep_last` of the fed tokens.
* `commit` (after): every block the pass filled gets an entry; a key not indexed yet is
  indexed (the pool then keeps the block, cached, once nobody holds it).

An entry stays indexed until the pool evicts its block (least recently used first, only
when no free block is left), which tells `forget`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdec.digest import TokenPrefix
from specdec.runtime.blocks import BlockPool, BlockTable


def digest_key(held: TokenPrefix, end: int) -> int:
    """The key of the block ending at position `end`: the digest of tokens[:end]."""
    return held.digest_of(end)


@dataclass(eq=False, slots=True)
class BlockEntry:
    """What a full block holds: its token ids after those of `parent` (None: the first
    block). `block` is the pool block with its keys and values while indexed, else None."""

    key: int
    tokens: tuple[int, ...]
    parent: BlockEntry | None
    block: int | None = None


def same_prefix(a: BlockEntry | None, b: BlockEntry | None) -> bool:
    """Whether two entries stand for the same tokens from position 0 to their end (equal
    token ids block by block; stops at the first entry they share)."""
    while a is not b:
        if a is None or b is None or a.tokens != b.tokens:
            return False
        a, b = a.parent, b.parent
    return True


@dataclass(frozen=True)
class PrefixCacheStats:
    lookups: int  # passes of a session that could have been served a cached block
    hits: int  # of them, those served at least one block
    hit_tokens: int  # fed tokens served from the cache (not computed)
    cached_blocks: int  # blocks indexed now (held by sessions or kept, evictable)
    evictions: int  # indexed blocks reused for other contents


class PrefixCache:
    def __init__(self, pool: BlockPool,
                 key: Callable[[TokenPrefix, int], int] = digest_key):
        """`key(held, end)`: a block's key from the tokens up to its end (a test passes a
        colliding one)."""
        self.pool = pool
        self.key = key
        self._index: dict[int, BlockEntry] = {}
        self._by_block: dict[int, BlockEntry] = {}
        self.lookups = self.hits = self.hit_tokens = 0
        pool.on_evict = self.forget

    def stats(self) -> PrefixCacheStats:
        with self.pool.lock:
            return PrefixCacheStats(self.lookups, self.hits, self.hit_tokens,
                                    len(self._index), self.pool.evictions)

    def attach(self, table: BlockTable, tokens: list[int], keep_last: int) -> int:
        """Attach the cached blocks that continue `table`'s prefix with `tokens`; returns
        how many of `tokens` they hold (the table's length moved past them)."""
        bs = self.pool.block_size
        start = table.length
        limit = start + len(tokens) - keep_last  # positions the cache may serve
        first = start // bs
        if (first + 1) * bs > limit:
            return 0
        with self.pool.lock:
            self.lookups += 1
            ahead = table.held.extended(tokens[:limit - start])
            parent = table.entries[first - 1] if first else None
            found = []
            for j in range(first, limit // bs):
                entry = self._index.get(self.key(ahead, (j + 1) * bs))
                if entry is None or entry.tokens != tuple(ahead.tokens[j * bs:(j + 1) * bs]) \
                        or not same_prefix(entry.parent, parent):
                    break
                found.append(entry)
                parent = entry
            if not found:
                return 0
            for j, entry in enumerate(found, first):
                self.pool.share(entry.block)
                table.place(j, entry.block)  # a partial block of its own is swapped out
            table.entries.extend(found)
            table.length = (first + len(found)) * bs
            ahead.truncate(table.length)
            table.held = ahead
            served = table.length - start
            self.hits += 1
            self.hit_tokens += served
            return served

    def commit(self, table: BlockTable) -> None:
        """Record the blocks of `table` that are full now and were not yet; index each
        whose key is free."""
        bs = self.pool.block_size
        with self.pool.lock:
            for j in range(len(table.entries), table.length // bs):
                key = self.key(table.held, (j + 1) * bs)
                tokens = tuple(table.held.tokens[j * bs:(j + 1) * bs])
                parent = table.entries[j - 1] if j else None
                known = self._index.get(key)
                if known is not None and known.tokens == tokens \
                        and same_prefix(known.parent, parent):
                    table.entries.append(known)  # the same contents are indexed already
                    continue
                entry = BlockEntry(key, tokens, parent)
                block = table.blocks[j]
                if known is None and not self.pool.needs_copy(block):
                    entry.block = block
                    self._index[key] = entry
                    self._by_block[block] = entry
                    self.pool.register(block)
                table.entries.append(entry)

    def forget(self, block: int) -> None:
        """The pool evicted `block`: its entry leaves the index."""
        with self.pool.lock:
            entry = self._by_block.pop(block, None)
            if entry is not None:
                entry.block = None
                if self._index.get(entry.key) is entry:
                    del self._index[entry.key]
