"""The model-free drafter's parts: the suffix trie, the tenants' output cache, and the
look-up's cost model (coordinator.drafters.trie, coordinator.drafters.costs). Pure
logic, no services."""

from __future__ import annotations

import random

import pytest

from coordinator.drafters.costs import (
    PRIOR,
    PRIOR_SEVERAL,
    Acceptance,
    best_length,
)
from coordinator.drafters.trie import NO_LOOKUP, Lookup, OutputCache, SuffixTrie, better


def substrings(seqs, depth):
    """Every substring of at most `depth` tokens, counted: what the trie must hold."""
    out: dict[tuple, int] = {}
    for seq in seqs:
        for s in range(len(seq)):
            for e in range(s + 1, min(len(seq), s + depth) + 1):
                out[tuple(seq[s:e])] = out.get(tuple(seq[s:e]), 0) + 1
    return out


def walk(trie):
    out, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for t, child in node.children.items():
            out[path + (t,)] = child.count
            stack.append((path + (t,), child))
    return out


def test_trie_holds_every_substring_with_its_count():
    rng = random.Random(0)
    seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    trie = SuffixTrie(depth=5)
    for s in seqs:
        trie.add(s)
    assert walk(trie) == substrings(seqs, 5)
    assert trie.nodes == 1 + len(walk(trie))


def test_appending_token_by_token_equals_adding_at_once():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]
    a, b = SuffixTrie(6), SuffixTrie(6)
    a.add(seq)
    for t in seq:
        b.append(t)
    assert walk(a) == walk(b)


def test_remove_takes_back_exactly_one_sequence():
    rng = random.Random(1)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 25))] for _ in range(5)]
    trie = SuffixTrie(depth=4)
    for s in seqs:
        trie.add(s)
    trie.remove(seqs[1])
    trie.remove(seqs[3])
    rest = [seqs[0], seqs[2], seqs[4]]
    assert walk(trie) == substrings(rest, 4)
    assert trie.nodes == 1 + len(walk(trie))
    for s in rest:
        trie.remove(s)
    assert trie.nodes == 1 and not trie.root.children


def test_draft_copies_the_continuation_of_the_longest_match():
    trie = SuffixTrie(depth=16)
    text = [10, 11, 12, 13, 14, 15, 16, 17, 50, 51, 12, 13]
    trie.extend(text)
    found = trie.draft(text, max_tokens=4)
    # "12 13" occurred before, followed by 14 15 16 17 (a single occurrence: p = 1 each)
    assert found.tokens == [14, 15, 16, 17]
    assert found.match_len == 2
    assert found.expected == pytest.approx(4.0)


def test_draft_prefers_the_more_specific_match_and_the_frequent_continuation():
    trie = SuffixTrie(depth=16)
    # after "7" comes 1 twice and 2 once; after "5 7" comes 2
    trie.extend([7, 1, 0, 7, 1, 0, 7, 2, 0, 5, 7, 2, 0, 3, 5, 7])
    found = trie.draft([3, 5, 7], max_tokens=1)
    assert found.tokens == [2] and found.match_len == 2
    found = trie.draft([9, 7], max_tokens=1)  # only "7" matches: its most frequent
    assert found.tokens == [1] and found.match_len == 1
    assert found.expected == pytest.approx(2 / 4) and found.first_prob == pytest.approx(0.5)


def test_draft_stops_when_the_path_becomes_unlikely():
    trie = SuffixTrie(depth=16)
    # after "1 2": 3 then 4 always, then 5/6/7/8 equally
    for tail in (5, 6, 7, 8):
        trie.add([1, 2, 3, 4, tail, 99])
    found = trie.draft([0, 1, 2], max_tokens=8, min_prob=0.3)
    assert found.tokens == [3, 4]  # 0.25 < 0.3: the fifth token is a guess not taken
    assert trie.draft([0, 1, 2], max_tokens=8, min_prob=0.2).tokens[:2] == [3, 4]
    assert len(trie.draft([0, 1, 2], max_tokens=8, min_prob=0.2).tokens) == 4


def test_no_match_no_draft():
    trie = SuffixTrie()
    trie.extend([1, 2, 3])
    assert trie.draft([1, 2, 3], 4) == NO_LOOKUP  # seen only at the end: no continuation
    assert not trie.draft([4], 4)
    assert not trie.draft([], 4)
    assert not trie.draft([1], 0)


def test_the_continuation_is_bounded_by_the_depth():
    trie = SuffixTrie(depth=4)
    trie.extend(list(range(20)) + [0, 1])
    found = trie.draft(list(range(20)) + [0, 1], max_tokens=10)
    assert found.match_len == 2 and found.tokens == [2, 3]  # depth 4 = 2 matched + 2


def test_output_cache_is_per_tenant_and_bounded():
    cache = OutputCache(per_tenant=2, depth=8)
    cache.add("alice", [1, 2, 3, 4])
    cache.add("bob", [1, 2, 9, 9])
    assert cache.draft("alice", [0, 1, 2], 2, 8, 0.1).tokens == [3, 4]
    assert cache.draft("bob", [0, 1, 2], 2, 8, 0.1).tokens == [9, 9]
    assert not cache.draft("carol", [0, 1, 2], 2, 8, 0.1)
    cache.add("alice", [5, 6, 7])
    cache.add("alice", [8, 6, 0])  # the first of alice's falls out
    assert cache.sequences("alice") == 2
    assert not cache.draft("alice", [0, 1, 2], 2, 8, 0.1)
    assert cache.draft("alice", [6], 1, 8, 0.1).match_len == 1
    off = OutputCache(per_tenant=0)
    off.add("alice", [1, 2, 3])
    assert off.sequences("alice") == 0


def test_better_prefers_the_longer_match_then_the_expected_length():
    a, b, c = Lookup([1], 3, 0.5), Lookup([2, 3], 2, 2.0), Lookup([4, 5], 3, 1.5)
    assert better(a, b) is a and better(b, a) is a
    assert better(a, c) is c
    assert better(NO_LOOKUP, b) is b


def test_best_length_weighs_expected_tokens_against_the_verify_cost():
    assert best_length(0.1, 8, 0.15) == (0, 0.0)  # no draft beats a plain step
    n, expected = best_length(0.9, 8, 0.15)
    assert n == 8 and expected == pytest.approx(sum(0.9 ** i for i in range(1, 9)))
    assert best_length(0.9, 3, 0.15)[0] == 3  # no more than there is
    assert best_length(0.5, 8, 0.0)[0] == 8  # a free verify: send everything
    assert best_length(0.4, 8, 0.15)[0] == 1
    assert best_length(1.0, 0, 0.15) == (0, 0.0)


def test_acceptance_learns_per_match_length():
    acc = Acceptance()
    assert acc.rate(1) == pytest.approx(PRIOR[0]) and acc.rate(9) == pytest.approx(PRIOR[-1])
    assert acc.rate(2, unique=False) == pytest.approx(PRIOR_SEVERAL[1])
    for _ in range(20):
        acc.observe(2, 4, 4)  # every draft accepted
    assert acc.rate(2) > 0.95 and acc.rate(1) == pytest.approx(PRIOR[0])
    assert acc.rate(2, unique=False) == pytest.approx(PRIOR_SEVERAL[1])  # its own bucket
    for _ in range(20):
        acc.observe(1, 3, 0)  # rejected at once
    assert acc.rate(1) < 0.05


def test_long_unique_matches_start_with_a_high_prior():
    acc = Acceptance()
    rates = [acc.rate(m) for m in range(1, 10)]
    assert rates == sorted(rates) and rates[-1] > 0.9  # longer matches copy more surely
    assert all(acc.rate(m, unique=False) < acc.rate(m) for m in range(1, 10))
    sampled = Acceptance(greedy=False)  # p(x) accepts a copy less surely than argmax
    assert all(sampled.rate(m) <= acc.rate(m) for m in range(1, 10))
