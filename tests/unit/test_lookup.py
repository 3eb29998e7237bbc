"""The model-free drafter: the suffix trie, the tenants' output cache, and the hybrid
choice of drafter (coordinator.lookup, coordinator.hybrid). Pure logic, no services."""

from __future__ import annotations

import random

import pytest

from coordinator.hybrid import (
    LOOKUP,
    MODEL,
    PRIOR,
    PRIOR_SEVERAL,
    Acceptance,
    Drafters,
    LookupSettings,
    best_length,
)
from coordinator.lookup import NO_LOOKUP, Lookup, OutputCache, SuffixTrie, better


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


def drafters(mode="hybrid", has_model=True, prompt=(10, 11, 12, 13, 14, 15), **kw):
    return Drafters(mode, list(prompt), LookupSettings(**kw), has_model)


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


def test_drafters_keep_the_trie_current_with_committed_tokens():
    d = drafters(mode="lookup", verify_cost=0.0)
    assert not d.lookup([10, 11, 12, 13, 14, 15, 77], 4)
    d.committed([77, 12, 13])
    assert d.lookup([10, 11, 12, 13, 14, 15, 77, 12, 13], 3).tokens == [14, 15, 77]
    assert d.lookup([10, 11, 12, 13, 14, 15, 77, 12, 13], 0) == NO_LOOKUP


def test_the_lookup_sends_fewer_tokens_for_weak_matches_and_learns():
    d = drafters(mode="lookup")
    context = [10, 11, 12, 13, 14, 15, 77, 12, 13]
    d.committed([77, 12, 13])
    first = d.lookup(context, 4)
    assert first.match_len == 2 and first.tokens == [14, 15]  # a = 0.5: two drafts pay
    for _ in range(10):
        d.observe(LOOKUP, 1, 1)  # (d.last: the match of 2 tokens)
    assert d.lookup(context, 4).tokens == [14, 15, 77, 12]  # learnt: all of them pay
    for _ in range(100):
        d.observe(LOOKUP, 3, 0)
    assert d.lookup(context, 4) == NO_LOOKUP  # learnt: none pays


def test_modes():
    found = Lookup([1, 2], 1, 1.5)
    assert drafters("lookup").choose(found, False) == LOOKUP
    assert drafters("model").trie is None
    assert drafters("model").lookup([10, 11], 4) == NO_LOOKUP
    assert drafters("hybrid", has_model=False).mode == "lookup"
    assert not drafters("lookup").uses_model and drafters("hybrid").uses_model
    assert drafters().choose(NO_LOOKUP, False) == MODEL
    with pytest.raises(ValueError, match="drafter must be one of"):
        drafters("both")


def test_hybrid_uses_a_long_match_while_the_models_acceptance_is_unknown():
    d = drafters(min_match=3)
    assert d.choose(Lookup([1], 3, 0.1), False) == LOOKUP
    # a short match, and nothing known of the model yet: the model
    assert d.choose(Lookup([1, 2, 3], 2, 2.9), False) == MODEL
    # the model's drafts are ready and nothing is known: keep the pipeline's chain
    assert d.choose(Lookup([1], 3, 0.1), True) == MODEL


def test_hybrid_compares_expected_tokens_per_cost():
    d = drafters(min_match=5, verify_cost=0.1, ready_round_cost=2.0, fresh_round_cost=3.0)
    d.observe(MODEL, 4, 3)
    assert d.model_accepted == pytest.approx(3.0)  # the first observation
    # The model must Propose first: 4 tokens for 3.0 (1.33 a unit) against, for a
    # look-up of 4 drafts, (1 + expected) / 1.4.
    assert d.choose(Lookup([1, 2, 3, 4], 2, 0.9), False) == LOOKUP  # 1.36 a unit
    assert d.choose(Lookup([1, 2, 3, 4], 2, 0.8), False) == MODEL  # 1.29 a unit
    # The model's drafts are ready: 4 tokens for 2.0 (2 a unit). The look-up also pays
    # for the chain it breaks when a draft is rejected: (3 - 2) (1 - a^4), a = 0.95 for
    # an 8-token match with one continuation (the prior).
    a = Acceptance().rate(8)
    assert a == pytest.approx(0.95)
    chain = 1 - a ** 4
    need = 2.0 * (1.4 + chain) - 1  # expected accepted drafts to tie
    assert d.choose(Lookup([1, 2, 3, 4], 8, need + 0.01), True) == LOOKUP
    assert d.choose(Lookup([1, 2, 3, 4], 8, need - 0.01), True) == MODEL
    # the same proposal without a ready pre-draft: no chain to break, the look-up wins
    assert d.choose(Lookup([1, 2, 3, 4], 8, need - 0.01), False) == LOOKUP
    # the choice depends on tokens only: the same state gives the same answer
    assert d.choose(Lookup([1, 2, 3, 4], 8, need + 0.01), True) == LOOKUP


def test_long_unique_matches_start_with_a_high_prior():
    acc = Acceptance()
    rates = [acc.rate(m) for m in range(1, 10)]
    assert rates == sorted(rates) and rates[-1] > 0.9  # longer matches copy more surely
    assert all(acc.rate(m, unique=False) < acc.rate(m) for m in range(1, 10))
    sampled = Acceptance(greedy=False)  # p(x) accepts a copy less surely than argmax
    assert all(sampled.rate(m) <= acc.rate(m) for m in range(1, 10))


def test_finished_output_joins_the_tenants_cache():
    cache = OutputCache(per_tenant=4, depth=8)
    settings = LookupSettings(verify_cost=0.0)
    d = Drafters("hybrid", [1, 2], settings, True, cache, "alice")
    d.committed([40, 41, 42, 43])
    d.finished()
    assert cache.draft("alice", [9, 40, 41], 2, 8, 0.1).tokens == [42, 43]
    # a new generation of the same tenant drafts from it
    d2 = Drafters("hybrid", [5, 6, 40, 41], settings, True, cache, "alice")
    assert d2.lookup([5, 6, 40, 41], 2).tokens == [42, 43]
    # no tenant: no cache
    d3 = Drafters("hybrid", [5, 6, 40, 41], settings, True, cache, None)
    assert not d3.lookup([5, 6, 40, 41], 2)
