"""`specdec load`'s statistics and outputs, on hand-made windows (pure logic)."""

from __future__ import annotations

import json

import pytest

from specdec.bench import load_report as lr
from specdec.bench.load_report import Load, LoadSample, Window

BASELINE, SPECULATIVE = "target-only", "speculative"


def sample(name, prompt, chunks, *, stream=0, started=0.0, seconds=None, ids=None,
           error=None, rounds=0, drafted=0, accepted=0, ks=()):
    """`chunks`: (seconds since sent, tokens) per token-carrying chunk."""
    tokens = sum(n for _, n in chunks)
    return LoadSample(name, prompt, tokens, seconds if seconds is not None else chunks[-1][0],
                      chunks[0][0] if chunks else None,
                      list(ids if ids is not None else range(tokens)), rounds=rounds,
                      drafted=drafted, accepted=accepted, stream=stream, started=started,
                      chunk_times=[t for t, _ in chunks], chunk_tokens=[n for _, n in chunks],
                      k_per_round=list(ks), error=error)


def test_percentile_interpolates_between_ranks():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert lr.percentile(xs, 50) == pytest.approx(2.5)
    assert lr.percentile(xs, 95) == pytest.approx(3.85)  # 3 + 0.85 * (4 - 3)
    assert lr.percentile(xs, 0) == 1.0 and lr.percentile(xs, 100) == 4.0
    assert lr.percentile([7.0], 95) == 7.0
    assert lr.percentile([], 50) is None


def test_inter_token_latency_divides_a_chunk_by_its_tokens():
    s = sample("x", "p", [(0.1, 1), (0.3, 4), (0.4, 1)])
    # 0.2 s for a 4-token chunk: 0.05 s per token, four times; then 0.1 s for one token
    assert lr.inter_token_latencies(s) == pytest.approx([0.05] * 4 + [0.1])
    assert lr.inter_token_latencies(sample("x", "p", [(0.1, 3)])) == []


def _windows():
    base = Window(BASELINE, None, 2, 2.0, [
        sample(BASELINE, "a", [(0.2, 1), (0.4, 1), (0.6, 1), (0.8, 1)], ids=[1, 2, 3, 4],
               rounds=4, ks=[0, 0, 0, 0]),
        sample(BASELINE, "b", [(0.3, 1), (0.5, 1)], stream=0, started=1.0, ids=[5, 6],
               rounds=2, ks=[0, 0]),
        sample(BASELINE, "b", [(0.1, 1), (0.2, 1)], stream=1, seconds=2.0, ids=[5, 6],
               rounds=2, ks=[0, 0]),
    ])
    spec = Window(SPECULATIVE, BASELINE, 2, 1.0, [
        sample(SPECULATIVE, "a", [(0.1, 1), (0.3, 3)], ids=[1, 2, 3, 4], rounds=2,
               drafted=4, accepted=2, ks=[0, 4]),
        sample(SPECULATIVE, "b", [(0.2, 2)], stream=1, ids=[5, 7], rounds=1, drafted=4,
               accepted=1, ks=[4]),
        sample(SPECULATIVE, "b", [(0.5, 1)], stream=1, started=0.2, error="UNAVAILABLE",
               ids=[9]),
    ])
    refs = Window(BASELINE, None, 1, 1.0, [sample(BASELINE, "a", [(0.1, 4)], ids=[1, 2, 3, 4]),
                                           sample(BASELINE, "b", [(0.1, 2)], ids=[5, 6])],
                  phase="reference")
    return [refs, base, spec]


def test_summary_aggregate_ratio_latencies_stats_and_exactness():
    rows = {r.scenario: r for r in lr.summarise(_windows())}
    assert set(rows) == {BASELINE, SPECULATIVE}  # the reference window makes no row
    b, s = rows[BASELINE], rows[SPECULATIVE]
    assert (b.requests, b.tokens, b.aggregate_tps) == (3, 8, pytest.approx(4.0))
    # every token received counts, a failed request's too: 7 tokens in 1 s
    assert (s.requests, s.tokens, s.aggregate_tps) == (3, 7, pytest.approx(7.0))
    assert s.throughput_ratio == pytest.approx(7.0 / 4.0) and b.throughput_ratio is None
    assert s.errors == {"UNAVAILABLE": 1} and b.errors == {}
    # per stream: baseline stream 0 = 6 tokens over 0..1.5 s, stream 1 = 2 tokens in 2 s
    assert b.stream_tps_median == pytest.approx((4.0 + 1.0) / 2)
    # TTFT of the successful requests only: 0.1 and 0.2 s
    assert (s.ttft_p50_ms, s.ttft_p95_ms) == (pytest.approx(150), pytest.approx(195))
    # ITL: the 3-token chunk 0.2 s after the first: 3 x 66.7 ms
    assert s.itl_p50_ms == pytest.approx(200 / 3)
    assert b.itl_p50_ms == pytest.approx(200) and b.itl_p95_ms == pytest.approx(200)
    assert s.latency_p50_ms == pytest.approx(250)
    assert (s.rounds, s.mean_k, s.acceptance) == (3, pytest.approx(8 / 3), pytest.approx(3 / 8))
    assert s.tokens_per_round == pytest.approx(6 / 3)
    assert b.mean_k == 0 and b.acceptance is None
    # greedy: prompt b's speculative output [5, 7] differs from target-only alone [5, 6]
    assert (s.compared, s.mismatches) == (2, 1)
    assert (b.compared, b.mismatches) == (3, 0)


def test_sampled_runs_are_not_checked_and_repeats_pool():
    ws = _windows()
    rows = {r.scenario: r for r in lr.summarise(ws + [ws[1]], greedy=False)}
    assert rows[SPECULATIVE].mismatches is None
    b = rows[BASELINE]
    assert (b.requests, b.tokens, b.seconds) == (6, 16, 4.0)


def test_markdown_json_round_trip_and_plots(tmp_path):
    rows = lr.summarise(_windows())
    meta = {"machine": "m", "prompts": 8, "max_new_tokens": 4, "temperature": 0.0,
            "requests_per_stream": 1, "repeats": 1, "failed": {"peer": "Boom"}}
    md, files = lr.write(rows, meta, tmp_path)
    assert (tmp_path / "load.md").read_text() == md
    lines = md.splitlines()
    assert any(line.startswith(f"| 2 | {SPECULATIVE} | 3 | 7.0 | 1.75x |") for line in lines)
    assert any("UNAVAILABLE 1 | NO (1/2) |" in line for line in lines)
    assert any(f"| 2 | {BASELINE} | 3 | 4.0 | - |" in line and "yes (3)" in line
               for line in lines)
    assert "throughput ratio = " in md and "section 12" in md
    assert "Failed and skipped: peer: Boom" in md
    back, meta_back = lr.load_json(tmp_path / "load.json")
    assert back == rows and meta_back == meta
    json.loads((tmp_path / "load.json").read_text())  # plain JSON
    names = {f.name for f in files}
    assert {"throughput_vs_concurrency.png", "itl_vs_throughput.png",
            "throughput_ratio_vs_concurrency.png"} <= names
    for f in files:
        assert f.exists() and f.stat().st_size > 0
    for png in (f for f in files if f.suffix == ".png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_sends_different_prompts_per_stream_and_stops_as_told():
    load = Load(3, 8, ("a", "b", "c", "d"), requests_per_stream=2)
    assert [load.message(s, 0) for s in range(3)] == ["a", "b", "c"]
    assert [load.message(2, i) for i in range(3)] == ["c", "d", "a"]
    assert load.more(1, 99.0) and not load.more(2, 0.0)
    assert load.sampling(1, 2).seed != load.sampling(2, 1).seed
    timed = Load(1, 8, ("a",), duration_s=5.0)
    assert timed.more(0, 99.0) and timed.more(3, 4.9) and not timed.more(3, 5.0)
