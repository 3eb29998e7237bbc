"""`specdec load`'s statistics and outputs, on hand-made windows (pure logic)."""

from __future__ import annotations

import json

import pytest

from specdec_tools.bench import load_report as lr
from specdec_tools.bench.load_report import Load, LoadSample, Window

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
    # steady state: after 0.2 s (stream 0's first token, made before the interval) to
    # 1.5 s (stream 0's end), 5 tokens arrive; the wall figure: 8 tokens in 2 s
    assert (b.requests, b.tokens, b.aggregate_tps) == (3, 8, pytest.approx(5 / 1.3))
    assert (b.wall_tps, b.steady_seconds, b.steady_fallbacks) == (
        pytest.approx(4.0), pytest.approx(1.3), 0)
    # after 0.2 s (stream 1's first) to 0.3 s (stream 0's end): stream 0's 3 tokens; the
    # wall figure counts every token received, a failed request's too: 7 tokens in 1 s
    assert (s.requests, s.tokens, s.aggregate_tps) == (3, 7, pytest.approx(30.0))
    assert s.wall_tps == pytest.approx(7.0)
    assert s.throughput_ratio == pytest.approx(30 / (5 / 1.3)) and b.throughput_ratio is None
    assert s.errors == {"UNAVAILABLE": 1} and b.errors == {}
    # per stream: baseline stream 0 = 6 tokens over 0..1.5 s, stream 1 = 2 tokens in 2 s
    assert b.stream_tps_median == pytest.approx((4.0 + 1.0) / 2)
    # TTFT of the successful requests only: 0.1 and 0.2 s
    assert (s.ttft_p50_ms, s.ttft_p95_ms) == (pytest.approx(150), pytest.approx(195))
    assert s.ttft_p99_ms == pytest.approx(199)
    # TPOT: a = 0.2 s over 3 tokens after the first; b = its 2 tokens in one chunk: 0
    assert (s.tpot_p50_ms, s.tpot_p99_ms) == (pytest.approx(100 / 3), pytest.approx(66))
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
    assert (b.aggregate_tps, b.steady_seconds) == (pytest.approx(5 / 1.3), pytest.approx(2.6))


def test_markdown_json_round_trip_and_plots(tmp_path):
    rows = lr.summarise(_windows())
    meta = {"machine": "m", "prompts": 8, "max_new_tokens": 4, "temperature": 0.0,
            "requests_per_stream": 1, "repeats": 1, "failed": {"peer": "Boom"}}
    md, files = lr.write(rows, meta, tmp_path)
    assert (tmp_path / "load.md").read_text() == md
    lines = md.splitlines()
    assert any(line.startswith(f"| 2 | grpc | {SPECULATIVE} | 3 | 30.0 | 7.0 | 7.80x |")
               for line in lines)
    assert any("UNAVAILABLE 1 | NO (1/2) |" in line for line in lines)
    assert any(f"| 2 | grpc | {BASELINE} | 3 | 3.8 | 4.0 | - |" in line and "yes (3)" in line
               for line in lines)
    header = next(line for line in lines if line.startswith("| N |"))
    assert header.startswith("| N | api | scenario |")
    assert "| ITL p50 / p95 ms | inter-chunk p50 / p95 ms |" in header
    assert any(f"| 2 | grpc | {SPECULATIVE} |" in line and "| 66.7 / 66.7 | 200.0 / 200.0 |"
               in line for line in lines)
    assert "Steady state:" not in md  # no window fell back
    assert "inter-chunk latency = " in md and "api = " in md
    assert "throughput ratio = " in md and "section 12" in md
    assert "Failed and skipped: peer: Boom" in md
    back, meta_back = lr.load_json(tmp_path / "load.json")
    assert back == rows and meta_back == meta
    json.loads((tmp_path / "load.json").read_text())  # plain JSON
    names = {f.name for f in files}
    assert {"throughput_vs_concurrency.png", "itl_vs_throughput.png",
            "throughput_ratio_vs_concurrency.png", "tpot_vs_concurrency.png"} <= names
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
    # the ratio is over the baseline through the same api (and N), steady state: 2
    # tokens in (0.2, 0.5] s over 3 in (0.3, 0.7] s (the wall figures: 8 and 4 tok/s)
    assert hs.throughput_ratio == pytest.approx((2 / 0.3) / (3 / 0.4))
    assert hb.throughput_ratio is None and (hs.wall_tps, hb.wall_tps) == (8.0, 4.0)
    assert by[("grpc", SPECULATIVE, 2)].throughput_ratio == pytest.approx(30 / (5 / 1.3))
    assert (hb.compared, hb.mismatches) == (1, 0)
    assert (hs.compared, hs.mismatches) == (1, 1)  # [1, 2, 3, 5] != gRPC's [1, 2, 3, 4]
    assert hs.ttft_p50_ms == pytest.approx(200) and hs.icl_p50_ms == pytest.approx(300)
    assert hs.itl_p50_ms == pytest.approx(150)  # 0.3 s over the second chunk's 2 tokens
    assert hb.icl_p50_ms == pytest.approx(100) and hb.itl_p50_ms == pytest.approx(100)
    assert (hs.mean_k, hs.acceptance) == (4, pytest.approx(3 / 8))
    problems = lr.failures(rows)
    assert f"http: {SPECULATIVE} N=1: 1 of 1 greedy outputs differ" in " ".join(problems)
    md = lr.markdown(rows, {"prompts": 2, "repeats": 1})
    assert f"| 1 | http | {SPECULATIVE} | 1 | 6.7 | 8.0 | 0.89x |" in md
    # without a gRPC reference in the run, an HTTP row is not checked against anything
    alone = {(r.api, r.scenario): r for r in lr.summarise(_http_windows())}
    assert alone[("http", SPECULATIVE)].compared == 0


def test_peer_rows_have_no_api():
    peer = Window("peer plain", None, 1, 1.0, [sample("peer plain", "a", [(0.1, 1)])])
    (row,) = lr.summarise([peer], greedy=False)
    assert row.api == "" and "| 1 | - | peer plain |" in "\n".join(lr.table([row]))


def test_a_peers_mismatches_are_findings_and_ours_are_failures():
    ours = lr.summarise(_windows())
    assert [f for f in lr.failures(ours) if "differ" in f] == [
        "grpc: speculative N=2: 1 of 2 greedy outputs differ from the same prompt's alone"]
    for row in ours:
        row.api = ""  # the same rows as a peer's
    assert not [f for f in lr.failures(ours) if "differ" in f]
    assert lr.findings(ours) == [
        "speculative N=2: 1 of 2 greedy outputs differ from the same prompt's alone"]


def test_http_driver_reads_sse_events_into_a_sample():
    """specdec_tools.bench.load_http: tokens and their count per chunk from specdec.token_ids
    (not the text), stats from the usage chunk, an error event's code, a stream cut
    before [DONE]."""
    import time

    from specdec_tools.bench.load_http import HttpVariant

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
    from specdec_tools.bench.load_http import HttpVariant

    load = Load(2, 16, ("a", "b"), temperature=0.0, timeout=30.0)
    spec = HttpVariant("127.0.0.1:1", None, "s").body("m", load, 1, 0)
    assert spec["messages"] == [{"role": "user", "content": "b"}]
    assert (spec["max_tokens"], spec["temperature"], spec["seed"]) == (16, 0.0, 1000)
    assert spec["stream"] is True and spec["stream_options"] == {"include_usage": True}
    assert "num_draft_tokens" not in spec  # the coordinator's default K
    assert HttpVariant("h:1", 0, "t").body("m", load, 0, 0)["num_draft_tokens"] == 0
    assert HttpVariant("h:1", 0, "t").base_url == "http://h:1"


def _steady_window(name="x"):
    """Three streams with a ramp and a tail; times from the window's start."""
    return Window(name, None, 3, 3.6, [
        # stream 0: tokens at 0.5, 1.0 (2), 1.5; then at 2.0 (2), 2.6; its end: 2.6
        sample(name, "a", [(0.5, 1), (1.0, 2), (1.5, 1)], seconds=1.6),
        sample(name, "b", [(0.4, 2), (1.0, 1)], started=1.6, seconds=1.0),
        # stream 1: its first token at 1.2, the latest first: t_lo; its end 3.6
        sample(name, "c", [(1.2, 1), (2.0, 3), (3.5, 1)], stream=1, seconds=3.6),
        # stream 2: tokens at 0.2, 0.8; then at 1.3, 2.2 (2), 2.8; its end: 2.9
        sample(name, "d", [(0.2, 1), (0.8, 1)], stream=2, seconds=0.9),
        sample(name, "e", [(0.4, 1), (1.3, 2), (1.9, 1)], stream=2, started=0.9,
               seconds=2.0),
    ], api="grpc")


def test_steady_state_counts_the_tokens_while_every_stream_is_active():
    w = _steady_window()
    # (t_lo, t_hi] = (1.2, 2.6]: stream 0's 1.5, 2.0 (2) and 2.6; stream 1's 2.0 (3), not
    # its 1.2 (made before); stream 2's 1.3 and 2.2 (2): 10 tokens in 1.4 s
    tokens, seconds = lr.steady_state(w)
    assert (tokens, seconds) == (10, pytest.approx(1.4))
    (row,) = lr.summarise([w], greedy=False)
    assert row.aggregate_tps == pytest.approx(10 / 1.4)
    assert (row.tokens, row.wall_tps) == (18, pytest.approx(18 / 3.6))  # ramp and tail in
    assert (row.steady_seconds, row.steady_fallbacks) == (pytest.approx(1.4), 0)
    for word in ("t_lo", "t_hi", "(t_lo, t_hi]", "wall figure"):
        assert word in lr.DEFINITIONS["aggregate"]
    assert "ramp and tail included" in lr.DEFINITIONS["wall"]


def _short_window(name="x", n=2):
    """One request per stream; stream 0 is done (0.2 s) before stream 1's first token
    (0.5 s): no interval with every stream active. N=3: a stream that got no token."""
    samples = [sample(name, "a", [(0.1, 1), (0.2, 1)]),
               sample(name, "b", [(0.5, 2)], stream=1)]
    if n == 3:
        samples.append(sample(name, "c", [], stream=2, seconds=0.3, error="DEADLINE_EXCEEDED"))
    return Window(name, None, n, 0.5, samples, api="grpc")


def test_a_window_without_a_steady_interval_falls_back_to_its_wall_time():
    assert lr.steady_state(_short_window()) is None
    assert lr.steady_state(_short_window(n=3)) is None
    # every stream overlaps, but stream 2 never got a token
    w = _short_window(n=3)
    w.samples[2] = sample("x", "c", [], stream=2, seconds=2.0, error="DEADLINE_EXCEEDED")
    assert lr.steady_state(w) is None
    (row,) = lr.summarise([_short_window()], greedy=False)
    assert row.aggregate_tps == row.wall_tps == pytest.approx(4 / 0.5)
    assert (row.steady_seconds, row.steady_fallbacks) == (pytest.approx(0.5), 1)
    md = lr.markdown([row], {"prompts": 2, "repeats": 1})
    assert ("Steady state: grpc: x N=2: 1 window(s) had no interval with every stream "
            "active; counted at wall time.") in md


def test_repeats_pool_the_steady_intervals():
    alone = Window("x", None, 3, 1.2, [
        sample("x", "a", [(0.1, 1), (0.5, 1), (0.9, 1)], seconds=1.0),
        sample("x", "b", [(0.2, 1), (0.6, 2)], stream=1, seconds=0.8),
        sample("x", "c", [(0.3, 1), (0.7, 1)], stream=2, seconds=1.2),
    ], api="grpc")
    assert lr.steady_state(alone) == (4, pytest.approx(0.5))  # (0.3, 0.8]: 8 tok/s
    (row,) = lr.summarise([_steady_window(), alone], greedy=False)
    # tokens over seconds, both summed (not the mean of 7.1 and 8 tok/s)
    assert row.aggregate_tps == pytest.approx((10 + 4) / (1.4 + 0.5))
    assert row.wall_tps == pytest.approx((18 + 8) / (3.6 + 1.2))
    # a window that falls back pools with its wall figure: 4 tokens in 0.5 s
    (row,) = lr.summarise([_steady_window(), _short_window(n=3)], greedy=False)
    assert row.aggregate_tps == pytest.approx((10 + 4) / (1.4 + 0.5))
    assert (row.steady_seconds, row.steady_fallbacks) == (pytest.approx(1.9), 1)
    assert "1 window(s) had no interval" in lr.markdown([row], {})


def test_tpot_per_request_percentiles():
    w = Window("x", None, 1, 9.0, [
        sample("x", "a", [(0.1, 1), (0.3, 2), (0.5, 2)], seconds=0.5),  # 0.4 s / 4: 0.1
        sample("x", "b", [(0.2, 1), (0.5, 1), (0.6, 1)], seconds=0.6),  # 0.4 s / 2: 0.2
        sample("x", "c", [(0.1, 2)], seconds=0.4),  # 0.3 s after its first token / 1: 0.3
        sample("x", "d", [(0.05, 1)], seconds=0.05),  # one token: no TPOT
        sample("x", "e", [(0.9, 1), (5.0, 1)], error="CANCELLED"),  # failed: none
    ], api="grpc")
    assert lr.time_per_output_token(w.samples[0]) == pytest.approx(0.1)
    (row,) = lr.summarise([w], greedy=False)
    assert (row.tpot_p50_ms, row.tpot_p99_ms) == (pytest.approx(200), pytest.approx(298))
    # TTFT over the successful requests: 0.05, 0.1, 0.1, 0.2
    assert (row.ttft_p50_ms, row.ttft_p99_ms) == (pytest.approx(100), pytest.approx(197))
    assert "(latency - TTFT) / (tokens - 1)" in lr.DEFINITIONS["tpot"]


def test_markdown_columns():
    rows = lr.summarise([_steady_window(), _short_window("y")], greedy=False)
    lines = lr.table(rows)
    header = lines[0]
    assert header == ("| N | api | scenario | requests | aggregate tok/s | wall tok/s "
                      "| throughput ratio | per-stream tok/s | TTFT p50 / p99 ms "
                      "| TPOT p50 / p99 ms | ITL p50 / p95 ms | inter-chunk p50 / p95 ms "
                      "| latency p50 ms | mean K | acceptance | errors | exact |")
    assert all(line.count("|") == header.count("|") for line in lines)
    y = next(line for line in lines if "| y |" in line)
    # y: 4 tokens in 0.5 s, both figures; TTFT 0.1 and 0.5 s; TPOT 0.1 s (a) and 0 s
    # (b: both its tokens in its first chunk)
    assert y.startswith("| 2 | grpc | y | 2 | 8.0 | 8.0 | - | ")
    assert "| 300 / 496 | 50.0 / 99.0 |" in y
    md = lr.markdown(rows, {})
    assert "- wall tok/s = " in md and "- time per output token (TPOT) = " in md


def test_an_old_load_json_row_loads(tmp_path):
    from dataclasses import asdict

    (row,) = lr.summarise([_steady_window()], greedy=False)
    new = {"wall_tps", "steady_seconds", "steady_fallbacks", "ttft_p99_ms", "tpot_p50_ms",
           "tpot_p99_ms"}
    old = {k: v for k, v in asdict(row).items() if k not in new}
    (tmp_path / "load.json").write_text(json.dumps({"meta": {"repeats": 1}, "rows": [old]}))
    (back,), meta = lr.load_json(tmp_path / "load.json")
    assert meta == {"repeats": 1}
    # an old file's aggregate tok/s was the wall figure
    assert back.aggregate_tps == back.wall_tps == row.aggregate_tps
    assert (back.steady_seconds, back.steady_fallbacks) == (0.0, 0)
    assert (back.ttft_p99_ms, back.tpot_p50_ms, back.tpot_p99_ms) == (None, None, None)
    assert back.ttft_p95_ms == row.ttft_p95_ms
    assert "| 400 / - | - / - |" in lr.table([back])[2]  # TTFT p99 and TPOT: none
