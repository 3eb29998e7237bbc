"""specdec bench-drafters' reduction of samples to rows (pure: synthetic samples)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec.bench.drafters import against_peers, markdown, summarise
from specdec.bench.harness import Sample
from specdec.bench.system import BASELINE

STATS = dict(rounds=10, drafted_tokens=20, accepted_tokens=15, lookup_rounds=4,
             lookup_drafted_tokens=8, lookup_accepted_tokens=6, pipelined_rounds=5,
             predrafts_wasted=3, guess_rounds=6, guess_rejections=2, guess_bonus_misses=1)


def sample(scenario, prompt, seconds, repeat=0, stats=None):
    s = Sample(scenario, prompt, 10, seconds, rounds=10, wire_bytes=1000)
    s.repeat = repeat
    if stats is not None:
        s.stats = SimpleNamespace(**stats)
    return s


def test_rows_give_speedups_per_prompt_group_and_per_drafter_figures():
    names = {"m-extract": "extraction", "m-chat": "chat", "m-code": "code"}
    samples = []
    for prompt, base_s, hyb_s in (("m-extract", 1.0, 0.25), ("m-chat", 1.0, 0.8),
                                  ("m-code", 1.0, 0.5)):
        samples += [sample(BASELINE, prompt, base_s), sample("hybrid", prompt, hyb_s,
                                                             stats=STATS),
                    sample("peer", prompt, base_s / 2)]
    rows = {r["scenario"]: r for r in summarise(samples, names)}
    hybrid = rows["hybrid"]
    assert hybrid["speedup"] == pytest.approx(2.0)  # median of 4, 1.25, 2
    assert hybrid["speedup_copy"] == pytest.approx(4.0)  # extraction alone
    assert hybrid["speedup_copy_code"] == pytest.approx(3.0)  # median of 4 and 2
    assert hybrid["per_prompt"] == {"extraction": 4.0, "chat": 1.25, "code": 2.0}
    assert hybrid["lookup_acceptance"] == pytest.approx(18 / 24)
    assert hybrid["model_acceptance"] == pytest.approx((45 - 18) / (60 - 24))
    # pre-drafts: started = 15 + 9 = 24, used = 15
    assert hybrid["all_accepted_hit_rate"] == pytest.approx(15 / 24)
    assert hybrid["guess_rejected"] == pytest.approx(1 / 3)
    assert hybrid["bytes_per_round"] == pytest.approx(100)
    assert "lookup_acceptance" not in rows["peer"]
    peers = against_peers(samples, ["hybrid"], ["peer"])
    assert peers[0]["ratio"] == pytest.approx(1.0)  # median of 2, 0.625 and 1
    md = markdown(list(rows.values()), peers, dict(
        command="specdec bench-drafters", date="today", machine="m", prompts=3,
        max_new_tokens=10, repeats=1, temperature=0.0, failed={}, mismatches=["x"]))
    assert "| hybrid |" in md and "4.00x" in md and "NOT EXACT: x" in md
