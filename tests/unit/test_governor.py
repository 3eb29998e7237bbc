"""The governor: drafting is kept only where it measurably pays (pure logic)."""

from __future__ import annotations

from coordinator.loop.governor import (
    DRAFT,
    PLAIN,
    PROBE_EVERY,
    PROBE_EVERY_CLEAR,
    WINDOW_S,
    Governor,
    bucket,
)

STEP_S = 0.1
WINDOW = round(WINDOW_S / STEP_S)  # steps per window


def run(gov: Governor, steps: int, gens: int, rate: dict[str, float]) -> list[str]:
    """`steps` steps of `gens` generations whose arm yields rate[arm] tokens per second
    per generation (steps of 0.1 s); the arms used, step by step."""
    arms = []
    for _ in range(steps):
        arm = DRAFT if gov.drafting(gens) else PLAIN
        arms.append(arm)
        gov.observe(gens, int(rate[arm] * gens * STEP_S), STEP_S)
    return arms


def test_buckets_are_rounded_powers_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 6, 8, 11, 12, 30, 32, 45)] == \
        [0, 1, 2, 2, 2, 3, 3, 3, 4, 5, 5, 5]


def test_each_load_measures_both_arms_then_keeps_the_better_and_probes_the_other():
    gov = Governor()
    arms = run(gov, WINDOW * 40, 8, {DRAFT: 30.0, PLAIN: 20.0})  # drafting pays 1.5x
    windows = arms[::WINDOW]
    assert windows[:2] == [DRAFT, PLAIN]  # measured first
    later = windows[2:]
    assert later.count(PLAIN) <= len(later) // PROBE_EVERY_CLEAR + 1  # rare probes
    assert later.count(PLAIN) >= 1


def test_drafting_that_does_not_pay_is_switched_off():
    gov = Governor()
    arms = run(gov, WINDOW * 40, 32, {DRAFT: 9.0, PLAIN: 10.0})
    later = arms[::WINDOW][2:]
    assert later.count(DRAFT) <= len(later) // PROBE_EVERY + 1
    assert later.count(PLAIN) > 0.8 * len(later)


def test_a_change_of_load_is_judged_on_its_own():
    gov = Governor()
    run(gov, WINDOW * 10, 32, {DRAFT: 9.0, PLAIN: 10.0})  # plain wins at 32
    arms = run(gov, WINDOW * 10, 2, {DRAFT: 40.0, PLAIN: 25.0})  # drafting wins at 2
    assert arms[::WINDOW][-5:].count(DRAFT) >= 4


def test_off_it_always_drafts():
    gov = Governor(enabled=False)
    assert set(run(gov, WINDOW * 4, 8, {DRAFT: 1.0, PLAIN: 2.0})) == {DRAFT}
