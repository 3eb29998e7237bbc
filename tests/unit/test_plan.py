"""The drafting decision: K per generation and step from a model of what a step costs and
what each generation's drafts are worth (pure logic: coordinator.loop.plan, costs,
acceptance)."""

from __future__ import annotations

import math
import random

import pytest

from coordinator.loop.acceptance import Acceptance, Priors, kind_of
from coordinator.loop.calibration import Calibration
from coordinator.loop.costs import MIN_SAMPLES, Costs, Fit
from coordinator.loop.plan import OTHER_END_EVERY, PROBE_EVERY, PROBE_REASON, Planner
from coordinator.loop.step_model import Candidate, StepModel, chain, expected_max
from specdec.sampling import SamplingParams


def teach(planner: Planner, verify=(0.020, 0.0009), propose=(0.002, 0.008, 0.001),
          overhead=0.002, sessions=(1, 4, 8, 16), busy_cost=0.0, plain_every=0) -> None:
    """Costs as a VerifyBatch of `tokens` = v0 + v1 tokens (+ busy_cost when the draft
    computes beside it), a draft pass over n sessions = d0 + d1 n, and a ProposeBatch's
    first pass and call = c + d0 + d1 (n + fed). `plain_every`: every such step drafts
    nothing (the busy term is then seen both ways)."""
    v0, v1 = verify
    c, d0, d1 = propose
    for i in range(4 * MIN_SAMPLES):
        n = sessions[i % len(sessions)]
        busy = not (plain_every and i % plain_every == 0)
        tokens = n * (1 + (i % 5 if busy else 0))
        planner.costs.verified(tokens, 0, busy, v0 + v1 * tokens + busy_cost * busy)
        passes = 2 + i % 4
        fed = n * (passes + i % 3)
        pass_s = d0 + d1 * n
        planner.costs.drafted(passes, n, fed, c + d1 * fed + passes * pass_s, pass_s)
        planner.costs.step(n, n if busy else 0, overhead + 0.05, 0.05)


def gens(n: int, a: float = 0.9, cap: int = 8, **kw) -> list[Candidate]:
    return [Candidate(a, cap, True, **kw) for _ in range(n)]


def test_fit_recovers_a_line_and_shrugs_off_an_outlier():
    fit = Fit(2)
    for n in range(1, 1 + 2 * MIN_SAMPLES):
        fit.add((1.0, n), 0.004 + 0.001 * n)
    fit.add((1.0, 3.0), 0.5)  # a step slowed by something else
    assert fit(1.0, 40) == pytest.approx(0.044, rel=0.02)
    assert fit.ready and fit.scale < 0.001


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


def test_each_generation_gets_its_own_k():
    """Decided per generation: in the same step, drafts that are accepted more often are
    worth a longer round, and drafts that are seldom accepted are not worth one."""
    planner = Planner(default_k=4, k_max=8)
    teach(planner, verify=(0.02, 0.0015), propose=(0.001, 0.004, 0.0002))
    out = planner.plan([Candidate(0.97, 8, True), Candidate(0.75, 8, True),
                        Candidate(0.1, 8, True)])
    assert out[0] > out[1] > out[2] == 0


def test_a_generation_whose_drafts_do_not_pay_says_why():
    planner = Planner(default_k=4, k_max=8)
    teach(planner, verify=(0.02, 0.002))
    out = planner.plan(gens(7, a=0.95) + [Candidate(0.05, 8, True)])
    assert out[-1] == 0 and min(out[:-1]) > 0
    reason = planner.reasons[-1]
    assert reason.startswith("acceptance 0.05 below break-even ")
    even = float(reason.rsplit(" ", 1)[1])
    assert 0.05 < even < 0.95
    # at the break-even acceptance (a little above), it would draft
    assert planner.plan(gens(7, a=0.95) + [Candidate(min(0.99, even + 0.05), 8, True)])[-1] > 0


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


def test_a_generation_that_cannot_draft_gives_its_own_reason():
    planner = Planner(default_k=4, k_max=8)
    teach(planner)
    out = planner.plan(gens(2, a=0.9) + [Candidate(0.9, 0, True, why_not="one token left")])
    assert out[-1] == 0 and planner.reasons[-1] == "one token left"


def test_the_drafts_cost_to_the_target_is_learnt_when_both_kinds_of_step_are_seen():
    planner = Planner(default_k=4, k_max=8)
    teach(planner, busy_cost=0.006, plain_every=3)
    c = planner.costs
    assert c.busy_known
    assert c.verify_s(8, 0, True) - c.verify_s(8, 0, False) == pytest.approx(0.006, abs=0.001)


def test_unknown_draft_cost_to_the_target_and_a_close_call_probe_now_and_then():
    """Drafting planned to win by less than the margin while the draft's cost to the
    target was never seen: every PROBE_EVERY-th step runs the server-K generations
    target-only, so that the term is measured on the same generations."""
    planner = Planner(default_k=4, k_max=8)
    teach(planner, verify=(0.02, 0.0012), propose=(0.001, 0.004, 0.0003))
    assert not planner.costs.busy_known
    close = gens(8, a=0.6)
    plans, reasons = [], []
    for _ in range(2 * PROBE_EVERY):
        plans.append(planner.plan(close))
        reasons.append(list(planner.reasons))
    probes = [i for i, ks in enumerate(plans) if not any(ks)]
    assert len(probes) == 2 and probes[1] - probes[0] == PROBE_EVERY
    assert all(all(ks) for i, ks in enumerate(plans) if i not in probes)
    assert all(r == [PROBE_REASON] * 8 for i, r in enumerate(reasons) if i in probes)
    # a request that set K drafts anyway: a probe could not be target-only then
    planner2 = Planner(default_k=4, k_max=8)
    teach(planner2, verify=(0.02, 0.0012), propose=(0.001, 0.004, 0.0003))
    mixed = close + [Candidate(0.6, 4, True, fixed=True)]
    for _ in range(2 * PROBE_EVERY):
        assert planner2.plan(mixed)[-1] == 4 and not planner2.probe


def test_clear_gains_are_not_probed():
    planner = Planner(default_k=4, k_max=8)
    teach(planner)  # cheap drafts, cheap verify: drafting wins by far
    plans = [planner.plan(gens(2, a=0.95)) for _ in range(2 * PROBE_EVERY)]
    assert all(all(ks) for ks in plans)


def test_close_goodputs_choose_the_longer_round():
    planner = Planner(default_k=4, k_max=8)
    teach(planner)
    step = StepModel(planner, gens(1, a=0.9), [0])
    best = step.best_k(0)
    rates = []
    for k in range(9):
        step.set(0, k)
        rates.append(step.goodput())
    assert rates[best] >= 0.96 * max(rates)
    assert all(r < 0.96 * max(rates) for r in rates[best + 1:])


def test_chain_tokens_and_misses():
    extra, drafts, miss = chain(0.8, 3)
    hold = 0.8 ** 4
    pi = 0.8 / (1 - hold + 0.8)
    assert extra == pytest.approx(pi * ((1 - hold) / 0.2 - 1)) and miss == 0.0
    assert drafts == pytest.approx(3 * pi)
    extra, drafts, miss = chain(0.8, 3, fetch=True)  # every round has drafts
    assert extra == pytest.approx((1 - hold) / 0.2 - 1) and drafts == 3
    assert miss == pytest.approx(1 - hold)
    assert chain(0.9, 0) == (0.0, 0.0, 0.0)
    assert chain(0.8, 3, fetch=True, fetched=3) == chain(0.8, 3, fetch=True)


def test_chain_with_a_shorter_fetch_after_a_miss():
    """A miss fetches 1 draft: that round's tokens are 1 + a, its pre-draft holds with
    a^2; in the long run the rounds with K drafts are held / (1 - hold + held) of them."""
    a, k = 0.7, 3
    hold, hold_1 = a ** 4, a ** 2
    held = hold_1 / (1 - hold + hold_1)
    extra, drafts, miss = chain(a, k, fetch=True, fetched=1)
    assert extra == pytest.approx(held * ((1 - hold) / (1 - a) - 1) + (1 - held) * a)
    assert drafts == pytest.approx(held * 3 + (1 - held) * 1)
    assert miss == pytest.approx(1 - held)
    # held more often than with K fetched (a^2 > a^4), each fetched round verifies less
    assert miss < chain(a, k, fetch=True)[2] and drafts < 3


def test_expected_max_of_two_noisy_calls():
    assert expected_max(0.05, 0.08, 0.0) == 0.08
    assert expected_max(0.05, 0.05, 0.01) == pytest.approx(0.05 + 0.01 / math.sqrt(2 * math.pi))
    assert expected_max(0.05, 0.2, 0.01) == pytest.approx(0.2, rel=1e-6)
    rng = random.Random(1)
    draws = [max(rng.gauss(0.06, 0.006), rng.gauss(0.065, 0.008)) for _ in range(40000)]
    assert expected_max(0.06, 0.065, 0.01) == pytest.approx(sum(draws) / len(draws), rel=0.01)


def test_prefills_do_not_flatten_the_cost_of_a_round_token():
    """A prompt's tokens cost little each; fitted on one line with rounds' tokens they
    would make drafts look nearly free. The two are fitted apart."""
    costs = Costs()
    v0, per_round_token, per_prefill_token = 0.050, 0.0025, 0.0002
    for i in range(4 * MIN_SAMPLES):
        tokens = 32 * (1 + i % 3)  # 32 sessions, K = 0..2
        prefill = 300 * (i % 2)  # every other step holds a prompt
        costs.verified(tokens, prefill, True,
                       v0 + per_round_token * tokens + per_prefill_token * prefill)
    assert costs.verify_s(96, 0, True) == pytest.approx(v0 + per_round_token * 96, rel=0.02)
    assert costs.verify_s(32, 300, True) == pytest.approx(
        v0 + per_round_token * 32 + per_prefill_token * 300, rel=0.02)


def test_acceptance_is_a_ratio_of_decayed_counts():
    acc = Acceptance(prior=0.5, prior_weight=2.0, keep=1.0)
    assert acc.rate == 0.5
    acc.observe(3, 4)  # three accepted, then a rejection: 3 successes in 4 trials
    assert acc.rate == pytest.approx((3 + 1) / (4 + 2))
    acc.observe(0, 1)  # one rejected draft: one trial, not a rate of 0 for the round
    assert acc.rate == pytest.approx((3 + 1) / (5 + 2))
    acc.observe(2, 2)  # all accepted: no failure counted
    assert acc.rate == pytest.approx((5 + 1) / (7 + 2))


def test_priors_are_kept_per_drafter_and_kind():
    assert kind_of(SamplingParams()) == "greedy"
    assert kind_of(SamplingParams(temperature=0.7, presence_penalty=0.5)) == \
        "sampled+penalised"
    priors = Priors()
    greedy = priors.of("model", "greedy")
    for _ in range(200):
        greedy.observe(4, 4)
    assert greedy.rate > 0.95
    # a kind not seen yet starts from what the drafter earns on the others
    assert priors.of("model", "sampled").prior == pytest.approx(greedy.rate)
    assert priors.of("lookup", "greedy").prior == 0.7


def test_a_lone_generation_fetches_1_where_draft_passes_are_dear_and_k_where_calls_are():
    """After a miss a lone generation fetches fetch_drafts (1) where a draft pass costs a
    good part of a Verify (the Qwen2.5-Coder pair: its round's own pre-draft then holds
    more often and the target waits less), and its whole K where a call costs far more
    than its passes (the tiny models: the K drafts come at about the price of one)."""
    one = [Candidate(0.7, 3, True, greedy=True)]
    pair = Planner(default_k=3, k_max=8)
    teach(pair, verify=(0.143, 0.008), propose=(0.005, 0.038, 0.0005))
    pair.plan(one)
    assert pair.last_k > 0 and pair.fetch_now == 1
    assert pair.fetch_size(one, [3], [0]) == 1  # and fetching it pays
    tiny = Planner(default_k=3, k_max=8)
    teach(tiny, verify=(0.005, 0.0005), propose=(0.010, 0.0005, 0.0001))
    tiny.plan([Candidate(0.9, 3, True, greedy=True)])
    assert tiny.fetch_now == tiny.last_k == 3
    several = Planner(default_k=3, k_max=8)
    teach(several, verify=(0.005, 0.0005), propose=(0.010, 0.0005, 0.0001))
    several.plan(gens(2, a=0.9, cap=3))  # not alone: the planner's fetch_drafts
    assert several.fetch_now == 1


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
        assert engine._to_fetch(missed[:3], [4, 4, 4]) == ([0, 1], 1)
        # a cold draft session prefills beside the target instead; without a draft
        # model there is nothing to fetch
        assert engine._to_fetch(missed, [4] * 5) == ([0, 1], 1)
    finally:
        engine.close()


def test_all_drafting_is_left_when_none_drafting_is_better_though_no_one_gains_alone():
    """A local optimum of the coordinate ascent: with a draft that slows the target's
    pass whenever any generation drafts (busy_cost), a generation leaving a step where
    all draft saves only its own tokens; the climb from none drafting finds the better
    step."""
    planner = Planner(default_k=4, k_max=15)
    teach(planner, busy_cost=0.03, plain_every=3)
    g = gens(16, a=0.7)
    stuck = planner._ascend(g, [4] * 16, list(range(16)))  # from the last step's K
    plain = StepModel(planner, g, [0] * 16)
    assert sum(stuck.ks) > 0 and stuck.goodput() < 0.8 * plain.goodput()
    planner._previous = {i: 4 for i in range(16)}
    # past FULL_SEARCH generations the other end is climbed every OTHER_END_EVERY steps
    plans = [planner.plan(g, list(range(16))) for _ in range(OTHER_END_EVERY)]
    assert plans[-1] == [0] * 16
    assert planner.plan(g, list(range(16))) == [0] * 16  # and it stays there
    # and the other way: from none drafting, a light draft for everyone is found
    light = Planner(default_k=4, k_max=15)
    teach(light)
    light._previous = {i: 0 for i in range(4)}
    assert all(k > 0 for k in light.plan(gens(4, a=0.9), list(range(4))))


def test_calibration_keeps_steps_where_a_few_draft_apart_from_those_where_most_do():
    """A step where one generation of 16 drafts delivers about what a target-only one
    does; one where all draft can fall short of its prediction. Each share has its own
    factor, so the second does not talk the first out of drafting."""
    c = Calibration()
    for _ in range(50):
        c.observe(16, 16, 70.0, 100.0, 1.0, 1.0)  # all drafting: 0.7 of the prediction
        c.observe(16, 2, 100.0, 100.0, 1.0, 1.0)  # two drafting: as predicted
        c.observe(16, 0, 100.0, 100.0, 1.0, 1.0)
    none, few, most = c.factors(16)
    assert most < 0.8
    assert abs(few - 1.0) < 0.02 and abs(none - 1.0) < 0.02
    assert [Calibration.share(d, 16) for d in (0, 1, 4, 5, 16)] == [0, 1, 1, 2, 2]
    assert Calibration.share(1, 2) == 2  # with few generations, any drafting is "most"
