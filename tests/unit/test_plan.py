"""The lockstep planner: K per step from goodput over both services (pure logic)."""

from __future__ import annotations

import pytest

from coordinator.loop.plan import MIN_SAMPLES, Acceptance, Candidate, Fit, Planner


def teach(planner: Planner, verify=(0.020, 0.0009), propose=(0.002, 0.008, 0.001),
          overhead=0.002, sessions=(1, 4, 8, 16)) -> None:
    """Costs as a VerifyBatch of `tokens` = v0 + v1 tokens, a draft pass over n sessions
    = d0 + d1 n, and a ProposeBatch's first pass and call = c + d0 + d1 (n + fed)."""
    v0, v1 = verify
    c, d0, d1 = propose
    for i in range(4 * MIN_SAMPLES):
        n = sessions[i % len(sessions)]
        passes = 2 + i % 4
        fed = n * (passes + i % 3)
        planner.costs.target.add((1.0, n * (1 + i % 5), 0.0), v0 + v1 * n * (1 + i % 5))
        pass_s = d0 + d1 * n
        planner.costs.drafted(passes, n, fed, c + d1 * fed + passes * pass_s, pass_s)
        planner.costs.step(overhead + 0.05, 0.05)


def gens(n: int, a: float = 0.9, cap: int = 8, **kw) -> list[Candidate]:
    return [Candidate(a, cap, True, **kw) for _ in range(n)]


def test_fit_recovers_a_line():
    fit = Fit(2)
    for n in range(1, 1 + 2 * MIN_SAMPLES):
        fit.add((1.0, n), 0.004 + 0.001 * n)
    assert fit(1.0, 40) == pytest.approx(0.044, rel=0.02)
    assert fit.ready


def test_until_costs_are_measured_everyone_drafts_the_default_k():
    planner = Planner(default_k=4, k_max=15)
    assert planner.plan(gens(3, cap=8) + gens(1, cap=2)) == [4, 4, 4, 2]


def test_a_request_that_set_k_drafts_it_whatever_the_load():
    planner = Planner(default_k=4, k_max=15)
    teach(planner, verify=(0.02, 0.01))  # a target that pays dearly for every token
    out = planner.plan(gens(4, a=0.5) + [Candidate(0.5, 6, True, fixed=True)])
    assert out[-1] == 6
    assert all(k < 4 for k in out[:-1])


def test_k_falls_as_the_target_pays_more_per_token():
    ks = []
    for per_token in (0.0002, 0.002, 0.02):
        planner = Planner(default_k=4, k_max=8)
        teach(planner, verify=(0.02, per_token), propose=(0.001, 0.001, 0.0002))
        ks.append(max(planner.plan(gens(8, a=0.8))))
    assert ks[0] > ks[1] >= ks[2] and ks[2] == 0


def test_k_falls_as_the_draft_pays_more_per_pass():
    ks = []
    for per_pass in (0.001, 0.01, 0.05):
        planner = Planner(default_k=4, k_max=8)
        teach(planner, propose=(0.001, per_pass, 0.0005))
        ks.append(max(planner.plan(gens(8, a=0.85))))
    assert ks[0] > ks[1] > ks[2]


def test_a_generation_whose_drafts_do_not_pay_drafts_none():
    planner = Planner(default_k=4, k_max=8)
    teach(planner, verify=(0.02, 0.002))
    out = planner.plan(gens(7, a=0.95) + [Candidate(0.05, 8, True)])
    assert out[-1] == 0 and min(out[:-1]) > 0


def test_a_cold_draft_session_starts_drafting_only_when_its_catch_up_pays():
    """A generation the draft holds nothing of must be prefilled there first: worth it
    with many tokens left to draft, not for the last few."""
    planner = Planner(default_k=4, k_max=8)
    teach(planner, propose=(0.002, 0.004, 0.0005))
    warm = gens(3, a=0.95)
    assert planner.plan(warm + [Candidate(0.95, 8, True, catch_up=200, remaining=500)])[-1] > 0
    assert planner.plan(warm + [Candidate(0.95, 8, True, catch_up=200, remaining=6)])[-1] == 0


def test_without_any_model_draft_k_only_caps_the_look_up():
    planner = Planner(default_k=4, k_max=8)
    teach(planner)
    assert planner.plan([Candidate(0.9, 8, False), Candidate(0.9, 3, False)]) == [4, 3]


def test_not_adaptive_keeps_the_default():
    planner = Planner(default_k=4, k_max=8, adaptive=False)
    teach(planner, verify=(0.02, 0.02))
    assert planner.plan(gens(4, a=0.3)) == [4, 4, 4, 4]


def test_acceptance_is_a_ratio_of_decayed_counts():
    acc = Acceptance(prior=0.5, prior_weight=2.0, keep=1.0)
    assert acc.rate == 0.5
    acc.observe(3, 4)  # three accepted, then a rejection: 3 successes in 4 trials
    assert acc.rate == pytest.approx((3 + 1) / (4 + 2))
    acc.observe(0, 1)  # one rejected draft: one trial, not a rate of 0 for the round
    assert acc.rate == pytest.approx((3 + 1) / (5 + 2))
    acc.observe(2, 2)  # all accepted: no failure counted
    assert acc.rate == pytest.approx((5 + 1) / (7 + 2))


def test_prefills_do_not_flatten_the_cost_of_a_round_token():
    """A prompt's tokens cost little each; fitted on one line with rounds' tokens they
    would make drafts look nearly free. The two are fitted apart."""
    planner = Planner(default_k=4, k_max=15)
    v0, per_round_token, per_prefill_token = 0.050, 0.0025, 0.0002
    for i in range(4 * MIN_SAMPLES):
        tokens = 32 * (1 + i % 3)  # 32 sessions, K = 0..2
        prefill = 300 * (i % 2)  # every other step holds a prompt
        planner.costs.target.add((1.0, tokens, prefill),
                                 v0 + per_round_token * tokens + per_prefill_token * prefill)
    assert planner.costs.verify_s(96) == pytest.approx(v0 + per_round_token * 96, rel=0.02)
    assert planner.costs.verify_s(32, 300) == pytest.approx(
        v0 + per_round_token * 32 + per_prefill_token * 300, rel=0.02)
    one_line = Fit(2)
    for x, y in planner.costs.target.samples:
        one_line.add((1.0, x[1] + x[2]), y)
    assert one_line(1.0, 96) < 0.8 * planner.costs.verify_s(96)  # what it replaced


def test_a_request_that_set_k_is_fetched_for_only_when_greedy():
    """After a missed pre-draft, drafting first is the planner's call for a server-K
    generation and a greedy one that set K (its output is the target's whatever the
    drafts), never for a sampled one that set K (its seeded text must not depend on
    measured timings)."""
    from coordinator.loop.engine import Engine

    engine = Engine(Planner(default_k=4, k_max=15))
    try:
        missed = [Candidate(0.9, 4, True), Candidate(0.9, 4, True, fixed=True, greedy=True),
                  Candidate(0.9, 4, True, fixed=True), Candidate(0.9, 4, True, cold=True),
                  Candidate(0.9, 4, False)]
        assert engine._to_fetch(missed[:3], [4, 4, 4]) == [0, 1]
        # a cold draft session prefills beside the target instead; without a draft
        # model there is nothing to fetch
        assert engine._to_fetch(missed, [4] * 5) == [0, 1]
    finally:
        engine.close()
