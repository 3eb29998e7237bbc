"""The committed ids (specdec.digest.TokenPrefix) and the sync formula CacheView.plan
(docs/design.md, "The cache-sync rule")."""

from __future__ import annotations

import random

import pytest

from coordinator.remote.view import CacheView
from specdec import digest
from specdec.digest import TokenPrefix

PROMPT = [101, 7, 42, 9, 13]


def view_holding(tokens: list[int]) -> CacheView:
    v = CacheView()
    v.holds(tokens)
    return v


def check_plan(view: CacheView, committed: TokenPrefix, keep: int, new: list[int]) -> None:
    keep_len, keep_digest, new_tokens = view.plan(committed)
    assert keep_len == keep
    assert new_tokens == new
    assert keep_digest == digest.digest(committed.tokens[:keep])
    # The request rebuilds exactly the committed ids.
    assert committed.tokens[:keep_len] + new_tokens == committed.tokens


# -- TokenPrefix (the committed ids) ----------------------------------------------------


def test_committed_prefix_digests():
    c = TokenPrefix(list(PROMPT))
    assert len(c) == len(PROMPT)
    assert c.prefix == [0] + digest.prefix_digests(PROMPT)
    c.extend([1, 2])
    c.extend([])
    c.extend([3])
    full = PROMPT + [1, 2, 3]
    assert c.tokens == full
    assert len(c) == len(full)
    assert c.prefix == [digest.digest(full[:i]) for i in range(len(full) + 1)]


def test_committed_copies_its_input():
    src = list(PROMPT)
    c = TokenPrefix(src)
    src.append(5)
    assert c.tokens == PROMPT


def test_committed_empty():
    c = TokenPrefix([])
    assert len(c) == 0
    assert c.prefix == [digest.EMPTY]


# -- CacheView.plan -------------------------------------------------------------------


def test_empty_view_sends_everything():
    check_plan(CacheView(), TokenPrefix(list(PROMPT)), 0, PROMPT)


def test_single_token_committed():
    c = TokenPrefix([5])
    check_plan(CacheView(), c, 0, [5])
    check_plan(view_holding([5]), c, 0, [5])  # cap: len(committed) - 1 = 0
    check_plan(view_holding([5, 6, 7]), c, 0, [5])


def test_view_holding_exactly_committed_is_capped():
    c = TokenPrefix(list(PROMPT))
    check_plan(view_holding(PROMPT), c, len(PROMPT) - 1, [PROMPT[-1]])


def test_view_longer_than_committed_is_capped():
    c = TokenPrefix(list(PROMPT))
    check_plan(view_holding(PROMPT + [1, 2, 3]), c, len(PROMPT) - 1, [PROMPT[-1]])


@pytest.mark.parametrize("k, accepted", [(k, a) for k in (1, 2, 4) for a in range(k)])
def test_after_rejection(k, accepted):
    """The drafts were x_1..x_K; the first `accepted` were kept, then a recovered token."""
    drafts = [1000 + i for i in range(k)]
    recovered = 555
    c = TokenPrefix(list(PROMPT))
    c.extend(drafts[:accepted] + [recovered])
    n = len(PROMPT)
    # Target: fed committed + all drafts. Keeps the prompt and the accepted drafts.
    check_plan(view_holding(PROMPT + drafts), c, n + accepted, [recovered])
    # Draft: fed committed + drafts[:-1]; same common prefix.
    check_plan(view_holding(PROMPT + drafts[:-1]), c, n + min(accepted, k - 1),
               c.tokens[n + min(accepted, k - 1):])


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_all_accepted(k):
    drafts = [1000 + i for i in range(k)]
    bonus = 777
    c = TokenPrefix(list(PROMPT))
    c.extend(drafts + [bonus])
    n = len(PROMPT)
    # The draft never fed its own x_K: it gets x_K and the bonus.
    check_plan(view_holding(PROMPT + drafts[:-1]), c, n + k - 1, [drafts[-1], bonus])
    # The target fed all K drafts: it gets the bonus only.
    check_plan(view_holding(PROMPT + drafts), c, n + k, [bonus])


def test_token_values_decide_the_common_prefix():
    # Rolled back to just before the first token that differs from what the cache holds.
    c = TokenPrefix(list(PROMPT))
    c.extend([1000, 2000])
    check_plan(view_holding(PROMPT + [1000, 1001, 1002]), c, len(PROMPT) + 1, [2000])
    # A committed token equal to the cached one is kept, up to the len - 1 cap.
    c = TokenPrefix(list(PROMPT))
    c.extend([1000, 1001])
    check_plan(view_holding(PROMPT + [1000, 1001, 1002]), c, len(PROMPT) + 1, [1001])


def test_divergence_inside_the_prompt():
    c = TokenPrefix(list(PROMPT))
    other = list(PROMPT)
    other[2] = -1
    check_plan(view_holding(other), c, 2, PROMPT[2:])


def test_forget_resets_to_zero():
    c = TokenPrefix(list(PROMPT) + [1, 2])
    v = view_holding(PROMPT + [1])
    v.forget()
    assert v.tokens == []
    check_plan(v, c, 0, c.tokens)


def test_holds_copies_its_input():
    src = list(PROMPT)
    v = view_holding(src)
    src[1] = -5
    src.append(3)
    assert v.tokens == PROMPT


def test_empty_committed():
    keep_len, keep_digest, new = view_holding([1, 2]).plan(TokenPrefix([]))
    assert (keep_len, keep_digest, new) == (0, digest.EMPTY, [])


@pytest.mark.parametrize("seed", range(20))
def test_random_rounds_keep_view_and_committed_consistent(seed):
    """Simulate rounds like the loop does and check the formula against a direct
    longest-common-prefix computation at every step."""
    rng = random.Random(seed)
    c = TokenPrefix([rng.randrange(100) for _ in range(rng.randrange(1, 6))])
    draft_view, target_view = CacheView(), CacheView()
    for _ in range(15):
        k = rng.randrange(1, 5)
        for view in (draft_view, target_view):
            lcp = 0
            while (lcp < min(len(view.tokens), len(c) - 1)
                   and view.tokens[lcp] == c.tokens[lcp]):
                lcp += 1
            check_plan(view, c, lcp, c.tokens[lcp:])
        drafts = [rng.randrange(100) for _ in range(k)]
        draft_view.holds(c.tokens + drafts[:-1])
        target_view.holds(c.tokens + drafts)
        accepted = rng.randrange(0, k + 1)
        c.extend(drafts[:accepted] + [rng.randrange(100, 200)])
        if rng.random() < 0.1:
            target_view.forget()
