"""The benchmark's arithmetic, on synthetic samples (pure logic)."""

from __future__ import annotations

import json

import pytest

from specdec.verify import TokenKind
from specdec_tools.bench import harness, report
from specdec_tools.bench.harness import Sample

A, R, B, T = TokenKind.ACCEPTED, TokenKind.RECOVERED, TokenKind.BONUS, TokenKind.TARGET


def test_rounds_from_kinds():
    assert report.rounds_from_kinds([A, A, R, B, A, A, A, A, B, R]) == [2, 0, 4, 0]
    assert report.rounds_from_kinds([T, T]) == []


def sample(name, prompt, tokens, seconds, kinds=(), rounds=0, propose=(), verify=(),
           ids=None, wire=0):
    return Sample(name, prompt, tokens, seconds, 0.1, list(ids or range(tokens)), list(kinds),
                  rounds, list(propose), list(verify), wire)


def test_summary_speedup_acceptance_bound_and_exactness():
    base = [sample(report.BASELINE, p, 10, 1.0, [T] * 10, 10, verify=[0.1] * 10)
            for p in ("a", "b")]
    # K=2: per prompt, rounds accept 2 (+bonus), 1, 0, 2 (+bonus), 0 drafts
    kinds = [A, A, B, A, R, R, A, A, B, R]
    spec = [sample("specdec K=2", p, 10, 0.5, kinds, 5, propose=[0.1] * 5, verify=[0.15] * 5,
                   wire=500) for p in ("a", "b")]
    rows = {r.scenario: r for r in report.summarise(base + spec, 0.0)}
    r = rows["specdec K=2"]
    assert r.k == 2 and r.speedup == pytest.approx(2.0)
    assert r.alpha == pytest.approx(5 / 8)  # 5 accepted, 3 recovered
    assert r.mean_accepted == pytest.approx(5 / 5)
    assert r.acceptance_by_position == pytest.approx([3 / 5, 2 / 5])
    assert r.cost_ratio_c == pytest.approx(0.5) and r.verify_cost_ratio == pytest.approx(1.5)
    a = 5 / 8
    assert r.bound == pytest.approx((1 - a ** 3) / (1 - a) / (2 * 0.5 + 1.5))
    assert r.efficiency == pytest.approx(2.0 / r.bound)
    assert r.wire_bytes_per_round == pytest.approx(100)
    # (wall time - RPC time) / rounds, over both samples (synthetic numbers):
    assert r.coordinator_overhead_ms_per_round == pytest.approx(1000 * (1.0 - 2.5) / 10)
    assert r.exact is True and rows[report.BASELINE].exact is True


def test_a_mismatch_is_reported_as_not_exact():
    base = [sample(report.BASELINE, "a", 3, 1.0, [T] * 3, 3, verify=[0.1] * 3, ids=[1, 2, 3])]
    spec = [sample("specdec K=1", "a", 3, 1.0, [A, B, R], 2, propose=[0.1] * 2,
                   verify=[0.1] * 2, ids=[1, 2, 4])]
    # A peer that reports its ids is judged too, but it is not specdec: a peer computing
    # in bf16 differs, and the bench reports that rather than failing.
    peer = [sample("GenAI plain", "a", 3, 0.9, ids=[1, 2, 5]),
            Sample("a peer without ids", "a", 3, 0.9)]
    rows = {r.scenario: r for r in report.summarise(base + spec + peer, 0.0)}
    assert rows["specdec K=1"].exact is False and rows["specdec K=1"].system
    assert rows["GenAI plain"].exact is False and not rows["GenAI plain"].system
    assert rows["a peer without ids"].exact is None  # not judged


def test_outputs(tmp_path):
    base = [sample(report.BASELINE, "a", 10, 1.0, [T] * 10, 10, verify=[0.1] * 10)]
    spec = [sample("specdec K=2", "a", 10, 0.5, [A, A, B] * 3 + [R], 4, propose=[0.1] * 4,
                   verify=[0.12] * 4)]
    rows = report.summarise(base + spec, 0.0)
    md = report.markdown(rows, {"machine": "test", "peak_rss_mb": {"target": 100.0}})
    assert "| specdec K=2 |" in md and "Peak RSS: target 100 MB" in md
    report.write_json(tmp_path / "b.json", rows, {"m": 1})
    assert json.loads((tmp_path / "b.json").read_text())["rows"][1]["k"] == 2
    files = report.plots(rows, tmp_path)
    assert {f.name for f in files} == {"speedup_vs_k.png", "acceptance_by_position.png",
                                       "tokens_per_s.png"}
    assert all(f.stat().st_size > 1000 for f in files)


class Fake:
    def __init__(self, name, tps, fail_after=None, may_fail=False):
        self.name, self.tps, self.calls = name, tps, 0
        self.fail_after, self.may_fail = fail_after, may_fail

    def run(self, prompt, max_new_tokens, sampling):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("peer broke")
        return Sample(self.name, prompt, max_new_tokens, max_new_tokens / self.tps,
                      token_ids=[sampling.seed])


def test_harness_interleaves_tags_and_skips_a_failing_peer():
    base, spec = Fake(report.BASELINE, 10), Fake("specdec K=4", 15)
    peer = Fake("peer", 5, fail_after=1, may_fail=True)
    failed = {}
    samples = harness.run_side_by_side([base, spec, peer], ["a", "b"], 8, repeats=2,
                                       failed=failed, say=lambda m: None)
    assert [x.scenario for x in samples[:3]] == [report.BASELINE, "specdec K=4", "peer"]
    assert {(x.prompt, x.repeat) for x in samples if x.scenario == "specdec K=4"} == \
        {("a", 0), ("b", 0), ("a", 1), ("b", 1)}
    assert [x.token_ids for x in samples if x.scenario == report.BASELINE] == [[0], [0], [1], [1]]
    assert peer.calls == 2 and list(failed) == ["peer @ temperature 0.0"]
    assert harness.speedup(samples, "specdec K=4", report.BASELINE) == pytest.approx(1.5)
    with pytest.raises(RuntimeError):  # specdec's own failures are not skipped
        harness.run_side_by_side([Fake("x", 1, fail_after=0)], ["a"], 4)
