"""LoadAwareK: K from measured batched costs, shrinking to 0 when the target saturates."""

from __future__ import annotations

import pytest

from coordinator.load import MIN_PASSES, PROBE_EVERY, LoadAwareK, TargetPasses


def _teach(ctl: LoadAwareK, t0: float, t1: float, sessions: int, k: int, accept: float,
           draft_s: float, rounds: int = 64) -> None:
    """Rounds whose target passes cost t0 + t1 * tokens with `sessions` per pass."""
    for i in range(rounds):
        tokens = sessions * (k + 1) + (i % 3)  # some spread for the fit
        accepted = round(accept * k)
        ctl.observe(k, accepted, accepted < k, draft_s * (k + 1), k + 1, sessions, tokens,
                    t0 + t1 * tokens)


def test_the_fit_recovers_the_pass_cost_line():
    passes = TargetPasses()
    for tokens in range(1, 40):
        passes.add(4, tokens, 0.040 + 0.002 * tokens)
    t0, t1, sessions = passes.fit()
    assert t0 == pytest.approx(0.040) and t1 == pytest.approx(0.002) and sessions == 4


def test_default_k_until_measured():
    ctl = LoadAwareK(k_max=15, pipelined=True)
    assert ctl.choose(4) == 4
    _teach(ctl, 0.05, 0.001, 1, 4, 0.7, 0.02, rounds=MIN_PASSES - 1)
    assert ctl.choose(4) == 4  # not enough passes yet


def test_light_load_keeps_the_default_k():
    """One session per pass: the default K (the measured best for one stream) stands."""
    ctl = LoadAwareK(k_max=15, pipelined=True)
    _teach(ctl, t0=0.048, t1=0.003, sessions=1, k=4, accept=0.75, draft_s=0.02)
    assert ctl.choose(4) == 4
    assert ctl.choose(2) == 2  # never above the K the request would get


def test_a_compute_bound_target_turns_speculation_off():
    """32 sessions per pass, each token costs real compute, mediocre acceptance: every
    drafted token costs more than it earns, so K = 0 (with a probe now and then)."""
    ctl = LoadAwareK(k_max=15, pipelined=True)
    _teach(ctl, t0=0.05, t1=0.004, sessions=32, k=2, accept=0.5, draft_s=0.03)
    choices = [ctl.choose(4) for _ in range(3)]
    assert choices == [0, 0, 0]
    t0, t1, sessions = ctl.passes.fit()
    assert ctl.goodput(0, t0, t1, sessions) > ctl.goodput(1, t0, t1, sessions)


def test_it_probes_now_and_then_at_k0():
    ctl = LoadAwareK(k_max=15, pipelined=True)
    _teach(ctl, t0=0.05, t1=0.004, sessions=32, k=2, accept=0.5, draft_s=0.03,
           rounds=PROBE_EVERY * 4)
    choices = [ctl.choose(4) for _ in range(PROBE_EVERY * 2)]
    assert choices.count(1) == 2 and choices.count(0) == PROBE_EVERY * 2 - 2


def test_k_falls_as_load_rises():
    ks = []
    for sessions in (1, 4, 8, 16, 32):
        ctl = LoadAwareK(k_max=15, pipelined=True)
        _teach(ctl, t0=0.045, t1=0.0025, sessions=sessions, k=4, accept=0.7, draft_s=0.02)
        ks.append(ctl.choose(4))
    assert ks == sorted(ks, reverse=True) and ks[0] == 4 and ks[-1] <= 1, ks
