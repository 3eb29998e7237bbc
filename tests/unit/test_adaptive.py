"""Adaptive K: bounded, and moving the right way for good and bad drafts."""

from __future__ import annotations

import pytest

from coordinator.drafters.adaptive import AdaptiveK, ConfidenceExit


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
    # up to where drafting K+1 tokens (K and the guess at the bonus) takes as long as
    # verifying K ((K+1) d = v(K) at K=8); past it the draft is the bottleneck.
    assert adaptive.k == (8 if pipelined else 16) and adaptive.alpha > 0.99


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


def exit_after(rounds: int, accepted_of_4: int, **kw) -> ConfidenceExit:
    ce = ConfidenceExit(**kw)
    for _ in range(rounds):
        ce.observe(4, accepted_of_4)
        assert 0.0 <= ce.threshold <= ce.max_threshold
    return ce


def test_confidence_exit_rises_for_a_draft_that_never_agrees():
    ce = exit_after(40, 0, threshold=0.3)
    assert ce.threshold == pytest.approx(ce.max_threshold)  # stops after one token
    assert ce.acceptance == pytest.approx(0.0)


def test_confidence_exit_falls_for_a_draft_that_always_agrees():
    ce = exit_after(40, 4, threshold=0.3)
    assert ce.threshold == 0.0  # never exits: full rounds
    assert ce.acceptance == pytest.approx(1.0)


def test_confidence_exit_moves_smoothly_towards_the_target():
    ce = ConfidenceExit(threshold=0.3, target_acceptance=0.8)
    ce.observe(4, 2)  # 0.5 <= 0.8: up, by (1 - beta2) * step
    assert ce.threshold == pytest.approx(0.3 + 0.5 * 0.05)
    ce.observe(4, 4)  # smoothed acceptance 0.75: still below the target, still up
    assert ce.acceptance == pytest.approx(0.75)
    assert ce.threshold == pytest.approx(0.3 + 2 * 0.5 * 0.05)
    ce.observe(0, 0)  # a round without drafts says nothing
    assert ce.acceptance == pytest.approx(0.75)
    ce.observe(4, 4)  # 0.875 > 0.8: down
    assert ce.threshold == pytest.approx(0.3 + 0.5 * 0.05)


def test_k_min_0_chooses_no_drafts_when_they_do_not_pay_and_probes_again():
    """Contrastive decoding: drafts that are mostly rejected and cost as much as the target
    lose to the plain form (K = 0); after probe_every plain rounds one round drafts again,
    and good acceptance brings K back."""
    adaptive = AdaptiveK(k_max=8, k=4, k_min=0, probe_every=3)
    for _ in range(6):
        adaptive.observe(0, 0, False, None, 0.050)  # plain rounds: 50 ms
        adaptive.observe(4, 0, True, 0.160, 0.070)  # 40 ms per draft, none accepted
    assert adaptive.k == 0
    for _ in range(2):
        adaptive.observe(0, 0, False, None, 0.050)
    assert adaptive.k == 0
    adaptive.observe(0, 0, False, None, 0.050)
    assert adaptive.k == 1  # the probe
    for _ in range(8):
        adaptive.observe(adaptive.k or 1, adaptive.k or 1, False, 0.005 * (adaptive.k or 1),
                         0.055)  # cheap drafts, all accepted
    assert adaptive.k >= 4
    assert AdaptiveK(k_max=8, k=4).k_min == 1  # speculative decoding never picks 0
