"""The prefix cache's bookkeeping with no model: BlockPool reference counts and LRU,
BlockTable copy-on-write, PrefixCache attach/commit, and collision safety.

A fake KV store stands in for the model: a pass writes, at each position, the digest of
the session's tokens up to it; `assert_reads_own_prefix` then checks every block a
session reads holds what a full prefill of its own tokens would have written.
"""

from __future__ import annotations

import random

import pytest

from specdec import digest
from specdec.runtime.blocks import BlockPool, BlockTable
from specdec.runtime.prefix_cache import PrefixCache

BS = 4


class FakeModel:
    """A pool, a prefix cache and a KV store of per-position digests."""

    def __init__(self, blocks: int = 4, max_blocks: int = 0, key=None):
        self.pool = BlockPool(BS, blocks, max_blocks)
        self.cache = PrefixCache(self.pool) if key is None else PrefixCache(self.pool, key)
        self.kv: dict[int, list[int | None]] = {}
        self.copies = 0

    def copy(self, src: int, dst: int) -> None:
        self.kv[dst] = list(self.kv.get(src, [None] * BS))
        self.copies += 1

    def feed(self, table: BlockTable, tokens: list[int], keep_last: int = 1) -> int:
        """What PagedOpenVINOBackend.forward_batch does around its infer; returns the
        tokens served from the cache."""
        served = self.cache.attach(table, tokens, keep_last)
        rest = tokens[served:]
        table.reserve(table.length + len(rest))
        table.make_writable(table.length, table.length + len(rest), self.copy)
        digests = digest.prefix_digests(rest, table.held.prefix[-1])
        for pos, d in enumerate(digests, table.length):
            self.kv.setdefault(table.blocks[pos // BS], [None] * BS)[pos % BS] = d
        table.advance(rest)
        self.cache.commit(table)
        return served

    def assert_reads_own_prefix(self, table: BlockTable) -> None:
        assert len(table.held) == table.length
        assert len(table.entries) == table.length // BS
        for pos in range(table.length):
            assert self.kv[table.blocks[pos // BS]][pos % BS] == table.held.digest_of(pos + 1)


def test_pool_counts_references_and_keeps_indexed_blocks_cached():
    pool = BlockPool(BS, 4)
    a, b = pool.take(2)
    pool.register(a)
    pool.share(a)
    assert pool.refs(a) == 2 and pool.needs_copy(a) and not pool.needs_copy(b)
    pool.give_back([a, b])
    assert (pool.refs(a), pool.cached, pool.free) == (1, 0, 3)
    pool.give_back([a])
    assert (pool.cached, pool.free) == (1, 4)  # cached blocks still count as takeable
    pool.share(a)  # a session attaches it again: no longer evictable
    assert (pool.cached, pool.refs(a)) == (0, 1)


def test_pool_takes_free_blocks_then_evicts_least_recently_used_then_grows():
    pool = BlockPool(BS, 4)
    evicted = []
    pool.on_evict = evicted.append
    blocks = pool.take(3)
    for block in blocks:
        pool.register(block)
    pool.give_back(blocks)  # the last block is freed first: the least recently used
    assert pool.cached == 3
    assert pool.take(1) == [3] and evicted == []  # the truly free one first
    assert sorted(pool.take(2)) == [1, 2] and evicted == [2, 1]
    assert pool.evictions == 2 and pool.capacity == 4
    pool.take(2)  # one cached left, then the pool grows
    assert evicted == [2, 1, 0] and pool.capacity == 8


def test_pool_never_grows_past_max_blocks():
    pool = BlockPool(BS, 2, max_blocks=2)
    pool.take(2)
    with pytest.raises(MemoryError):
        pool.take(1)


def test_second_session_is_served_whole_blocks_except_the_asked_logits():
    m = FakeModel()
    prompt = list(range(10, 20))  # 10 tokens: 2 full blocks
    a = BlockTable(m.pool)
    assert m.feed(a, prompt) == 0
    b = BlockTable(m.pool)
    assert m.feed(b, prompt) == 8  # 2 blocks; the last token is computed
    assert b.blocks[:2] == a.blocks[:2] and m.pool.refs(a.blocks[0]) == 2
    m.assert_reads_own_prefix(b)
    c = BlockTable(m.pool)
    assert m.feed(c, prompt[:8]) == 4  # keep_last=1 reaches into block 2: 1 block only
    assert m.feed(BlockTable(m.pool), prompt, keep_last=len(prompt)) == 0  # logprobs
    assert m.feed(BlockTable(m.pool), prompt, keep_last=3) == 4
    s = m.cache.stats()
    assert (s.lookups, s.hits, s.hit_tokens, s.cached_blocks) == (4, 3, 16, 2)


def test_a_partial_block_of_its_own_is_swapped_for_the_cached_full_one():
    m = FakeModel()
    prompt = list(range(30, 42))
    a, b = BlockTable(m.pool), BlockTable(m.pool)
    m.feed(a, prompt)
    m.feed(b, prompt[:6])  # block 1 half full, its own
    assert b.blocks[1] != a.blocks[1]
    assert m.feed(b, prompt[6:]) == 2  # positions 6, 7 served: block 1 is the cached one
    assert b.blocks[:2] == a.blocks[:2]
    m.assert_reads_own_prefix(b)


def test_crop_into_a_shared_block_copies_it_before_writing():
    m = FakeModel()
    prompt = list(range(50, 61))
    a, b = BlockTable(m.pool), BlockTable(m.pool)
    m.feed(a, prompt)
    m.feed(b, prompt)
    shared = b.blocks[1]
    b.crop(6)  # into block 1, which a holds and the index keeps
    m.feed(b, [7, 7, 7])
    assert m.copies == 1 and b.blocks[1] != shared and a.blocks[1] == shared
    m.assert_reads_own_prefix(a)
    m.assert_reads_own_prefix(b)
    # a crops back into its own indexed block: copied too, the cached copy stays right
    a.crop(5)
    m.feed(a, [9, 9])
    assert m.copies == 2 and a.blocks[1] != shared
    c = BlockTable(m.pool)
    assert m.feed(c, prompt) == 8 and c.blocks[1] == shared
    m.assert_reads_own_prefix(c)


def test_dropped_tables_give_their_blocks_back_and_the_cache_keeps_them():
    m = FakeModel(blocks=8)
    a = BlockTable(m.pool)
    m.feed(a, list(range(9)))  # 2 full blocks and one partial
    del a
    assert (m.pool.free, m.pool.cached) == (8, 2)
    b = BlockTable(m.pool)
    assert m.feed(b, list(range(9))) == 8
    m.assert_reads_own_prefix(b)


def test_eviction_under_max_blocks_forgets_the_index_entry():
    m = FakeModel(blocks=4, max_blocks=4)
    first = list(range(100, 112))  # 3 full blocks
    a = BlockTable(m.pool)
    m.feed(a, first + [1])
    del a  # 3 cached, 1 free
    b = BlockTable(m.pool)
    m.feed(b, list(range(200, 209)))  # 3 blocks: the free one, then 2 evicted
    s = m.cache.stats()
    assert (s.evictions, m.pool.capacity, s.cached_blocks) == (2, 4, 3)
    c = BlockTable(m.pool)
    del b
    assert m.feed(c, first + [1]) == 4  # only its first block survived
    m.assert_reads_own_prefix(c)


def test_a_colliding_key_is_a_miss_never_wrong_blocks():
    m = FakeModel(key=lambda held, end: end)  # every prefix of one length collides
    a = BlockTable(m.pool)
    m.feed(a, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = BlockTable(m.pool)
    assert m.feed(b, [1, 2, 3, 4, 0, 0, 0, 0, 9]) == 4  # block 0 equal, block 1 differs
    m.assert_reads_own_prefix(b)
    # Same block-1 tokens as a's, after another block 0: the key and the block's own
    # tokens match, the parent does not.
    c = BlockTable(m.pool)
    m.feed(c, [0, 0, 0, 0])
    assert m.feed(c, [5, 6, 7, 8, 9]) == 0
    assert c.blocks[1] != a.blocks[1]
    m.assert_reads_own_prefix(c)
    d = BlockTable(m.pool)  # c's block 0 was never indexed: its key was a's
    assert m.feed(d, [0, 0, 0, 0, 5, 6, 7, 8, 1]) == 0
    m.assert_reads_own_prefix(d)
    assert m.cache.stats().cached_blocks == 2  # a's two blocks


def test_random_sessions_always_read_their_own_prefix():
    rng = random.Random(3)
    m = FakeModel(blocks=4, max_blocks=64)
    stems = [[rng.randrange(3) for _ in range(rng.randrange(1, 14))] for _ in range(3)]
    tables = [BlockTable(m.pool) for _ in range(5)]
    for _ in range(400):
        t = rng.choice(tables)
        if t.length and rng.random() < 0.3:
            t.crop(rng.randrange(t.length))
        elif rng.random() < 0.1:
            tables[tables.index(t)] = BlockTable(m.pool)  # dropped, a new session
            continue
        tokens = (rng.choice(stems) if not t.length else []) + \
            [rng.randrange(3) for _ in range(rng.choice([1, 1, 3, 9]))]
        if t.length + len(tokens) > 40:
            t.crop(0)
        m.feed(t, tokens, rng.randrange(1, len(tokens) + 1))
        for table in tables:
            m.assert_reads_own_prefix(table)
    assert m.cache.stats().hits > 10 and m.copies > 0
