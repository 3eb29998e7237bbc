"""The offline replay of pipelined drafting (specdec_tools.bench.predraft_replay): rounds,
fetches and charges worked out by hand for each scheme."""

from __future__ import annotations

import pytest

from specdec_tools.bench.predraft_replay import (
    PassCosts,
    Scheme,
    agreement,
    median_speedup,
    replay,
)

COSTS = PassCosts({1: 10.0, 2: 12.0, 3: 14.0}, {1: 2.0, 3: 3.0})


def right(text):  # the draft's first choice is always the target's token
    return [[t, 0, 0] for t in text]


def test_pass_costs_interpolate_between_and_extend_beyond_the_measured_points():
    assert COSTS.draft(1) == 2.0 and COSTS.draft(2) == 2.5 and COSTS.draft(4) == 3.5
    assert PassCosts({1: 10.0}, {2: 4.0}).draft(4) == 8.0  # one point: proportional


def test_every_draft_right_holds_every_pre_draft_after_the_first_fetch():
    r = replay([5, 6, 7, 8, 9], right([5, 6, 7, 8, 9]), COSTS, Scheme(2))
    # round 1: fetch 2 drafts (2 x 2 ms), verify 3 wide (14 ms; the 3-pass pre-draft is
    # 6 ms); round 2 (1 token left to draft for): verify 2 wide, pre-draft held
    assert (r.rounds, r.fetched, r.ms) == (2, 1, 4 + 14 + 12)
    assert r.speedup == pytest.approx(5 * 10 / 30)


def test_a_branch_on_the_drafts_second_choice_holds_after_a_rejection():
    text = [1, 2, 3, 4]
    ranks = [[1, 0], [9, 2], [3, 0], [4, 0]]  # rejected at 1, where the second choice is right
    one = replay(text, ranks, COSTS, Scheme(2, branches=1))
    # 1 + 1 + 2 x 1 = 4 branches side by side: 3.5 ms a pass, 3 passes under a 14-ms verify
    assert (one.rounds, one.fetched, one.ms) == (2, 1, 4 + 14 + 12)
    today = replay(text, ranks, COSTS, Scheme(2))  # the miss is fetched: 1 draft, 2 ms
    assert (today.rounds, today.fetched, today.ms) == (2, 2, 4 + 14 + 2 + 12)


def test_fetching_none_after_a_miss_verifies_one_token_while_the_pre_draft_guesses():
    text = [5, 6, 7, 8, 9]
    r = replay(text, right(text), COSTS, Scheme(2, fetch=0))
    # a draftless round (10 ms), then 2 drafts at hand (14 ms), then the last token (10)
    assert (r.rounds, r.fetched, r.ms) == (3, 1, 10 + 14 + 10)


def test_a_shorter_fetch_verifies_fewer_drafts():
    text = [1, 2, 3, 4, 5, 6]
    ranks = [[1], [2], [3], [4], [5], [6]]
    r = replay(text, ranks, COSTS, Scheme(3, fetch=1))
    # fetch 1 (2 ms), verify 2 wide (12; the pre-draft, sized 3, takes 4 x 2 = 8), then
    # 3 drafts at hand: verify 4 wide (extrapolated 16 ms), its bonus the last token
    assert (r.rounds, r.fetched) == (2, 1)
    assert r.ms == pytest.approx(2 + 12 + 16)
    assert Scheme(3, fetch=1).label == "K=3, fetch 1"
    assert Scheme(2, branches=2).label == "K=2, 2 branches"


def test_agreement_and_the_median_over_texts():
    texts = [([1, 2, 3, 4], [[1, 0, 0], [9, 2, 0], [8, 7, 3], [4, 0, 0]])]
    a = agreement(texts)
    assert (a.top1, a.rank2_of_misses, a.ranks23_of_misses) == (0.5, 0.5, 1.0)
    assert median_speedup(texts * 3, COSTS, Scheme(1)) == \
        replay(*texts[0], COSTS, Scheme(1)).speedup
    with pytest.raises(ValueError, match="draft's ranks"):
        replay([1, 2], [[1]], COSTS, Scheme(1))
