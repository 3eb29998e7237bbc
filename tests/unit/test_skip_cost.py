"""specdec_tools.skip_tune.cost: greedy rounds replayed from agreement flags, the predicted
speedup from step costs, and the break-even acceptance; the int8 weight rounding that
stands for the OpenVINO draft's."""

from __future__ import annotations

import pytest
import torch

from specdec_tools.skip_tune.cost import StepCosts, break_even_acceptance, predict, simulate


def test_rounds_accept_the_run_of_agreements_capped_at_k():
    # 6 tokens: the draft gets tokens 0, 1 and 3, 4 right.
    flags = [[True, True, False, True, True, False]]
    r = simulate(flags, k=4)
    # round 1 drafts 4, accepts 2 (tokens 0, 1), the target gives token 2;
    # round 2 drafts min(4, 6-3-1)=2 (tokens 3, 4), accepts both, the target gives token 5
    assert (r.rounds, r.tokens, r.drafted, r.accepted) == (2, 6, 6, 4)
    r1 = simulate(flags, k=1)
    assert (r1.rounds, r1.tokens, r1.accepted) == (4, 6, 2)
    assert simulate([[False] * 5], 3).tokens_per_round == 1.0
    assert simulate([[True] * 9], 2).tokens_per_round == 3.0
    with pytest.raises(ValueError):
        simulate(flags, 0)


def test_predicted_speedup_is_the_ratio_of_rates():
    costs = StepCosts(draft_ms=5.0, verify_ms=lambda n: 20.0 + 2.0 * (n - 1), rpc_ms=1.0)
    p = predict([[True] * 9], costs, k=2)  # 3 tokens per round
    round_ms = 2 * 5.0 + 24.0 + 2.0
    assert p.speedup == pytest.approx((3 / round_ms) / (1 / 21.0))
    assert p.c == pytest.approx(0.25) and p.acceptance == 1.0
    never = predict([[False] * 9], costs, k=2)
    assert never.speedup < 1.0


def test_break_even_acceptance():
    # K=1 with a verify as cheap as a step: (1 + a) / (1 + c) = 1 at a = c
    assert break_even_acceptance(0.43, 1) == pytest.approx(0.43, abs=1e-6)
    assert break_even_acceptance(0.0, 4) == pytest.approx(0.0, abs=1e-6)
    # too costly a draft never pays
    assert break_even_acceptance(1.2, 1) == 1.0
    a = break_even_acceptance(0.2, 5, 1.3)
    tokens = (1 - a ** 6) / (1 - a)
    assert tokens == pytest.approx(5 * 0.2 + 1.3, rel=1e-6)


def test_int8_rounding_keeps_at_most_256_levels_per_row_and_stays_close():
    from specdec_tools.skip_tune.drafts import round_weights_int8

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 8)
    before = lin.weight.detach().clone()
    round_weights_int8(lin)
    after = lin.weight.detach()
    assert not torch.equal(before, after)
    for row_b, row_a in zip(before, after, strict=True):
        assert len(torch.unique(row_a)) <= 256
        step = (row_b.max().clamp(min=0) - row_b.min().clamp(max=0)) / 255
        assert (row_a - row_b).abs().max() <= step / 2 + 1e-6
