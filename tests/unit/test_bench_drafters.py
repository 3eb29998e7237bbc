"""specdec bench-drafters' reduction of samples to rows (pure: synthetic samples)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec_tools.bench.drafters import against_peers, greedy_mismatches, markdown, summarise
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.system import BASELINE

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


def test_greedy_mismatches_split_specdec_failures_from_peers_on_other_text():
    names = {"m-a": "extraction", "m-b": "code"}

    def ids(scenario, prompt, token_ids, repeat=0):
        s = Sample(scenario, prompt, len(token_ids), 1.0, token_ids=token_ids)
        s.repeat = repeat
        return s

    samples = [ids(BASELINE, "m-a", [1, 2, 3]), ids(BASELINE, "m-b", [4, 5]),
               ids(BASELINE, "m-a", [1, 2, 3], repeat=1),
               ids("hybrid", "m-a", [1, 2, 3]), ids("hybrid", "m-b", [4, 6]),
               ids("hybrid", "m-a", [1, 2], repeat=1),  # stopped early: differs too
               ids("genai", "m-a", [1, 2, 3]), ids("genai", "m-b", [9, 9, 9]),
               ids("no-ids peer", "m-b", [])]  # reports no ids: not judged
    ours, peers = greedy_mismatches(samples, ["hybrid"], names)
    assert ours == ["hybrid on code (repeat 0)", "hybrid on extraction (repeat 1)"]
    assert peers == ["genai on code (repeat 0)"]
    md = markdown([], [], dict(
        command="c", date="d", machine="m", prompts=2, max_new_tokens=3, repeats=2,
        temperature=0.0, failed={}, mismatches=[], peer_mismatches=peers,
        peers_checked=True))
    assert "Every GenAI text equals target-only's, token for token: no: genai on code" in md
