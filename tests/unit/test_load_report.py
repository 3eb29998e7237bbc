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


def _windows(api="grpc"):
    base = Window(BASELINE, None, 2, 2.0, [
        sample(BASELINE, "a", [(0.2, 1), (0.4, 1), (0.6, 1), (0.8, 1)], ids=[1, 2, 3, 4],
               rounds=4, ks=[0, 0, 0, 0]),
        sample(BASELINE, "b", [(0.3, 1), (0.5, 1)], stream=0, started=1.0, ids=[5, 6],
               rounds=2, ks=[0, 0]),
        sample(BASELINE, "b", [(0.1, 1), (0.2, 1)], stream=1, seconds=2.0, ids=[5, 6],
               rounds=2, ks=[0, 0]),
    ], api=api)
    spec = Window(SPECULATIVE, BASELINE, 2, 1.0, [
        sample(SPECULATIVE, "a", [(0.1, 1), (0.3, 3)], ids=[1, 2, 3, 4], rounds=2,
               drafted=4, accepted=2, ks=[0, 4]),
        sample(SPECULATIVE, "b", [(0.2, 2)], stream=1, ids=[5, 7], rounds=1, drafted=4,
               accepted=1, ks=[4]),
        sample(SPECULATIVE, "b", [(0.5, 1)], stream=1, started=0.2, error="UNAVAILABLE",
               ids=[9]),
    ], api=api)
    refs = Window(BASELINE, None, 1, 1.0, [sample(BASELINE, "a", [(0.1, 4)], ids=[1, 2, 3, 4]),
                                           sample(BASELINE, "b", [(0.1, 2)], ids=[5, 6])],
                  phase="reference", api=api)
    return [refs, base, spec]


def test_inter_chunk_latency_is_the_gap_between_chunks_not_per_token():
    s = sample("x", "p", [(0.1, 1), (0.3, 4), (0.4, 1)])
    assert lr.inter_chunk_latencies(s) == pytest.approx([0.2, 0.1])  # one per gap
    assert lr.inter_chunk_latencies(sample("x", "p", [(0.1, 3)])) == []
    assert "inter-chunk latency = " in lr.DEFINITIONS["icl"]
    assert "not divided" in lr.DEFINITIONS["icl"]


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
    # inter-chunk: that one gap of 0.2 s, whole; one token per chunk: the same as ITL
    assert (s.icl_p50_ms, s.icl_p95_ms) == (pytest.approx(200), pytest.approx(200))
    assert (b.icl_p50_ms, b.icl_p95_ms) == (b.itl_p50_ms, b.itl_p95_ms)
    assert b.api == s.api == "grpc"
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
    assert any(line.startswith(f"| 2 | grpc | {SPECULATIVE} | 3 | 7.0 | 1.75x |")
               for line in lines)
    assert any("UNAVAILABLE 1 | NO (1/2) |" in line for line in lines)
    assert any(f"| 2 | grpc | {BASELINE} | 3 | 4.0 | - |" in line and "yes (3)" in line
               for line in lines)
    header = next(line for line in lines if line.startswith("| N |"))
    assert header.startswith("| N | api | scenario |")
    assert "| ITL p50 / p95 ms | inter-chunk p50 / p95 ms |" in header
    assert any(f"| 2 | grpc | {SPECULATIVE} |" in line and "| 66.7 / 66.7 | 200.0 / 200.0 |"
               in line for line in lines)
    assert "inter-chunk latency = " in md and "api = " in md
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


def _http_windows():
    """Both targets-only agree, the HTTP speculative output of prompt a differs from the
    gRPC reference: HTTP is checked against gRPC's reference (no HTTP reference runs)."""
    base = Window(BASELINE, None, 1, 1.0, [
        sample(BASELINE, "a", [(0.3, 1), (0.5, 1), (0.6, 1), (0.7, 1)], ids=[1, 2, 3, 4]),
    ], api="http", reference_api="grpc")
    spec = Window(SPECULATIVE, BASELINE, 1, 0.5, [
        sample(SPECULATIVE, "a", [(0.2, 2), (0.5, 2)], ids=[1, 2, 3, 5], rounds=2,
               drafted=8, accepted=3, ks=[4, 4]),
    ], api="http", reference_api="grpc")
    return [base, spec]


def test_rows_per_api_checked_against_the_grpc_reference():
    grpc_windows = _windows()
    rows = lr.summarise(grpc_windows + _http_windows())
    by = {(r.api, r.scenario, r.concurrency): r for r in rows}
    assert set(by) == {("grpc", BASELINE, 2), ("grpc", SPECULATIVE, 2),
                       ("http", BASELINE, 1), ("http", SPECULATIVE, 1)}
    hb, hs = by[("http", BASELINE, 1)], by[("http", SPECULATIVE, 1)]
    # the ratio is over the baseline through the same api (and N): 8 tok/s over 4 tok/s
    assert hs.throughput_ratio == pytest.approx(2.0) and hb.throughput_ratio is None
    assert by[("grpc", SPECULATIVE, 2)].throughput_ratio == pytest.approx(7.0 / 4.0)
    assert (hb.compared, hb.mismatches) == (1, 0)
    assert (hs.compared, hs.mismatches) == (1, 1)  # [1, 2, 3, 5] != gRPC's [1, 2, 3, 4]
    assert hs.ttft_p50_ms == pytest.approx(200) and hs.icl_p50_ms == pytest.approx(300)
    assert hs.itl_p50_ms == pytest.approx(150)  # 0.3 s over the second chunk's 2 tokens
    assert hb.icl_p50_ms == pytest.approx(100) and hb.itl_p50_ms == pytest.approx(100)
    assert (hs.mean_k, hs.acceptance) == (4, pytest.approx(3 / 8))
    problems = lr.failures(rows)
    assert f"http: {SPECULATIVE} N=1: 1 of 1 greedy outputs differ" in " ".join(problems)
    md = lr.markdown(rows, {"prompts": 2, "repeats": 1})
    assert f"| 1 | http | {SPECULATIVE} | 1 | 8.0 | 2.00x |" in md
    # without a gRPC reference in the run, an HTTP row is not checked against anything
    alone = {(r.api, r.scenario): r for r in lr.summarise(_http_windows())}
    assert alone[("http", SPECULATIVE)].compared == 0


def test_peer_rows_have_no_api():
    peer = Window("peer plain", None, 1, 1.0, [sample("peer plain", "a", [(0.1, 1)])])
    (row,) = lr.summarise([peer], greedy=False)
    assert row.api == "" and "| 1 | - | peer plain |" in "\n".join(lr.table([row]))


def test_http_driver_reads_sse_events_into_a_sample():
    """specdec.bench.load_http: tokens and their count per chunk from specdec.token_ids
    (not the text), stats from the usage chunk, an error event's code, a stream cut
    before [DONE]."""
    import time

    from specdec.bench.load_http import HttpVariant

    def event(obj):
        return "data: " + json.dumps(obj)

    chunk = {"choices": [{"delta": {"content": "Hi"}}],
             "specdec": {"token_ids": [7, 8], "kinds": ["accepted", "bonus"]}}
    empty = {"choices": [{"delta": {"content": ""}, "finish_reason": "length"}],
             "specdec": {"token_ids": [], "kinds": []}}
    usage = {"choices": [], "usage": {"specdec": {"rounds": 2, "drafted_tokens": 4,
                                                  "accepted_tokens": 3,
                                                  "k_per_round": [4, 0]}}}
    lines = [event(chunk), "", event({**chunk, "specdec": {"token_ids": [9],
                                                           "kinds": ["recovered"]}}),
             "", event(empty), "", event(usage), "", "data: [DONE]", "", event(chunk)]
    s = LoadSample("x", "p", 0, 0.0)
    HttpVariant._read(iter(lines), s, time.perf_counter())
    assert s.token_ids == [7, 8, 9] and s.chunk_tokens == [2, 1] and len(s.chunk_times) == 2
    assert s.kinds == [1, 3, 2] and s.text == "HiHi" and s.error is None
    assert (s.rounds, s.drafted, s.accepted, s.k_per_round) == (2, 4, 3, [4, 0])
    failed = LoadSample("x", "p", 0, 0.0)
    HttpVariant._read(iter([event(chunk), event({"error": {"code": "unavailable"}}),
                            "data: [DONE]"]), failed, time.perf_counter())
    assert failed.error == "UNAVAILABLE" and failed.token_ids == [7, 8]
    cut = LoadSample("x", "p", 0, 0.0)
    HttpVariant._read(iter([event(chunk)]), cut, time.perf_counter())
    assert cut.error == "INCOMPLETE_STREAM"


def test_http_request_matches_the_grpc_scenarios():
    from specdec.bench.load_http import HttpVariant

    load = Load(2, 16, ("a", "b"), temperature=0.0, timeout=30.0)
    spec = HttpVariant("127.0.0.1:1", None, "s").body("m", load, 1, 0)
    assert spec["messages"] == [{"role": "user", "content": "b"}]
    assert (spec["max_tokens"], spec["temperature"], spec["seed"]) == (16, 0.0, 1000)
    assert spec["stream"] is True and spec["stream_options"] == {"include_usage": True}
    assert "num_draft_tokens" not in spec  # the coordinator's default K
    assert HttpVariant("h:1", 0, "t").body("m", load, 0, 0)["num_draft_tokens"] == 0
    assert HttpVariant("h:1", 0, "t").base_url == "http://h:1"
