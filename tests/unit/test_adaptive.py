"""Adaptive K: bounded, and moving the right way for good and bad drafts."""

from __future__ import annotations

import pytest

from coordinator.adaptive import AdaptiveK


def feed(adaptive: AdaptiveK, agree: bool, rounds: int = 30, d=0.01, v0=0.05, v1=0.005):
    for _ in range(rounds):
        k = adaptive.k
        accepted = k if agree else 0
        adaptive.observe(k, accepted, not agree, d * k, v0 + v1 * k)
        assert 1 <= adaptive.k <= adaptive.k_max


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_draft_that_always_agrees_pushes_k_up(pipelined):
    adaptive = AdaptiveK(k_max=16, k=2, pipelined=pipelined)
    adaptive.observe(0, 0, False, None, 0.05)
    feed(adaptive, agree=True)
    # Sequential: longer is always better when every draft is accepted (K_max). Pipelined:
    # up to where drafting K tokens takes as long as verifying them (K d = v(K) at K=10).
    assert adaptive.k == (10 if pipelined else 16) and adaptive.alpha > 0.99


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_draft_that_never_agrees_pushes_k_down(pipelined):
    adaptive = AdaptiveK(k_max=16, k=8, pipelined=pipelined)
    feed(adaptive, agree=False)
    assert adaptive.k == 1 and adaptive.alpha < 0.01


def test_bounds_and_expected_tokens():
    adaptive = AdaptiveK(k_max=4, k=9)
    assert adaptive.k == 4
    adaptive.alpha = 0.5
    assert adaptive.expected_tokens(1) == pytest.approx(1.5)
    assert adaptive.expected_tokens(3) == pytest.approx(1.875)


def test_a_pipelined_round_never_costs_more_than_a_sequential_one():
    seq, pipe = AdaptiveK(k_max=16, k=4), AdaptiveK(k_max=16, k=4, pipelined=True)
    for a in (seq, pipe):
        a.observe(0, 0, False, None, 0.1)
        for _ in range(20):  # 80% acceptance, cheap draft, expensive verify
            a.observe(a.k, 4, True, 0.005 * a.k, 0.1 + 0.01 * a.k)
    assert seq.alpha == pytest.approx(0.8, abs=0.01)
    for k in range(1, 17):
        assert pipe.round_seconds(k) <= seq.round_seconds(k) + 1e-12
