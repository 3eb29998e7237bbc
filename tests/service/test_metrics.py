"""Prometheus metrics (--metrics-port): real services and a loop, scraped over HTTP.

The figures each endpoint reports after a short generation are checked against what
the test itself saw: the loop's LoopStats, the rounds it streamed, and the requests the
clients sent (counted by wrapping the clients, independently of the metrics code).
"""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import specdec.metrics
from coordinator.clients import DraftClient, TargetClient
from coordinator.loop import SpeculativeLoop
from coordinator.policy import LoopPolicy
from coordinator.routing import Router
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec.metrics import ModelMetrics, PrometheusLoopMetrics, PrometheusModelMetrics
from specdec.sampling import SamplingParams
from specdec.verify import TokenKind
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

GREEDY = SamplingParams()
PROMPT = [1, 2, 3, 4, 5]
K = 4


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Samples:
    """One scrape: {(sample name, labels): value}. A missing sample is a KeyError."""

    def __init__(self, port: int):
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        self.values = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
        }

    def __call__(self, name: str, **labels) -> float:
        return self.values[(name, frozenset(labels.items()))]

    def has(self, name: str, **labels) -> bool:
        return (name, frozenset(labels.items())) in self.values


class Delta:
    """after - before for counters and histogram series (absent before = 0)."""

    def __init__(self, before: Samples, after: Samples):
        self.before, self.after = before, after

    def __call__(self, name: str, **labels) -> float:
        old = self.before(name, **labels) if self.before.has(name, **labels) else 0.0
        return self.after(name, **labels) - old


class Injected(grpc.RpcError):
    """A failed call: UNAVAILABLE (the replica is gone) or another code."""

    def __init__(self, code=grpc.StatusCode.UNAVAILABLE):
        super().__init__()
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "injected failure"


class Counting:
    """A client that counts its calls: attempts, resync errors, and per successful call
    the tokens the server must feed. Attempts numbered in `fail_on` (from 1) fail."""

    def __init__(self, channel, fail_on=(), fail_code=grpc.StatusCode.UNAVAILABLE):
        super().__init__(channel)
        self.fail_on, self.fail_code = set(fail_on), fail_code
        self.attempts = self.resync_errors = 0
        self.fed: list[int] = []

    def _count(self, call, fed: int):
        self.attempts += 1
        if self.attempts in self.fail_on:
            raise Injected(self.fail_code)
        try:
            result = call()
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                self.resync_errors += 1
            raise
        self.fed.append(fed)
        return result


class CountingDraft(Counting, DraftClient):
    def propose(self, sync, num_tokens, *args, **kwargs):
        return self._count(lambda: DraftClient.propose(self, sync, num_tokens, *args, **kwargs),
                           len(sync.new_tokens) + num_tokens - 1)  # K - 1 steps after


class CountingTarget(Counting, TargetClient):
    def verify(self, sync, drafts, *args, **kwargs):
        return self._count(lambda: TargetClient.verify(self, sync, drafts, *args, **kwargs),
                           len(sync.new_tokens) + len(drafts))


@pytest.fixture(scope="module")
def services():
    """((draft address, engine), (target address, engine)) with --metrics-port set."""
    made = []

    def up(create, cfg):
        server, port, engine = create(cfg)
        made.append((server, engine))
        server.start()
        return f"127.0.0.1:{port}", engine

    draft = up(create_draft, DraftConfig(model="tiny-random-draft", port=0, max_sessions=8,
                                         metrics_port=free_port()))
    target = up(create_target, TargetConfig(model="tiny-random", port=0, max_sessions=8,
                                            metrics_port=free_port()))
    yield draft, target
    for server, engine in made:
        server.stop(0)
        engine.model.metrics.close()


def test_a_generation_moves_every_endpoint_consistently(services, monkeypatch):
    (d_addr, d_engine), (t_addr, t_engine) = services
    d_port, t_port = d_engine.model.metrics.port, t_engine.model.metrics.port
    loop_metrics = PrometheusLoopMetrics()
    c_port = loop_metrics.serve(free_port(), "127.0.0.1")
    try:
        with grpc.insecure_channel(d_addr) as d_ch, grpc.insecure_channel(t_addr) as t_ch:
            draft, target = CountingDraft(d_ch), CountingTarget(t_ch)
            loop = SpeculativeLoop(draft, target, LoopPolicy(pipeline=False), metrics=loop_metrics)
            before = [Samples(p) for p in (c_port, d_port, t_port)]

            # Inside each Verify, just before the target's forward pass: its gauge.
            inflight_seen: list[float] = []
            sync = t_engine.model.sync

            def look_then_sync(*args, **kwargs):
                inflight_seen.append(Samples(t_port)("specdec_target_inflight_verify_requests"))
                return sync(*args, **kwargs)

            monkeypatch.setattr(t_engine.model, "sync", look_then_sync)

            # Between rounds: the kinds of the round's tokens and the three gauges.
            rounds: list[tuple[list[TokenKind], float, float, float]] = []

            def on_tokens(_tokens, kinds):
                rounds.append((list(kinds),
                               Samples(c_port)("specdec_coordinator_active_generations"),
                               Samples(d_port)("specdec_draft_live_sessions"),
                               Samples(t_port)("specdec_target_live_sessions")))

            result = loop.generate(PROMPT, 40, GREEDY, num_draft_tokens=K, on_tokens=on_tokens)
            c, d, t = (Delta(b, Samples(p)) for b, p in zip(before, (c_port, d_port, t_port),
                                                             strict=True))
    finally:
        loop_metrics.close()

    stats = result.stats
    generated = len(result.token_ids)
    assert generated == 40 and stats.rounds == len(rounds) == len(target.fed)
    # The premise that makes the checks below meaningful: the tiny draft half agrees.
    assert 0 < stats.accepted_tokens < stats.drafted_tokens
    assert stats.resyncs == stats.draft_fallbacks == stats.target_repins == 0

    # -- coordinator ---------------------------------------------------------------------
    drafted_rounds = sum(kinds != [TokenKind.TARGET] for kinds, *_ in rounds)
    assert c("specdec_spec_decode_num_drafts_total") == drafted_rounds == len(draft.fed)
    assert c("specdec_spec_decode_num_draft_tokens_total") == stats.drafted_tokens
    assert c("specdec_spec_decode_num_accepted_tokens_total") == stats.accepted_tokens
    assert (c("specdec_spec_decode_num_accepted_tokens_total")
            <= c("specdec_spec_decode_num_draft_tokens_total"))
    accepted_kinds = sum(kinds.count(TokenKind.ACCEPTED) for kinds, *_ in rounds)
    assert c("specdec_spec_decode_num_accepted_tokens_total") == accepted_kinds
    per_pos = [c("specdec_spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(K)]
    assert sum(per_pos) == c("specdec_spec_decode_num_accepted_tokens_total")
    assert per_pos == stats.accepted_per_position
    assert per_pos == sorted(per_pos, reverse=True)  # position i accepted => i - 1 was
    assert not c.after.has("specdec_spec_decode_num_accepted_tokens_per_pos_total",
                           position=str(K))
    assert c("specdec_coordinator_round_duration_seconds_count") == stats.rounds
    assert 0 < c("specdec_coordinator_round_duration_seconds_sum") <= stats.seconds
    assert c("specdec_coordinator_rpc_duration_seconds_count", rpc="propose") \
        == len(draft.fed) == len(draft.bytes.recent)
    assert c("specdec_coordinator_rpc_duration_seconds_count", rpc="verify") \
        == len(target.fed) == len(target.bytes.recent)
    assert c("specdec_coordinator_generated_tokens_total") == generated
    assert [active for _, active, _, _ in rounds] == [1.0] * len(rounds)
    assert c.after("specdec_coordinator_active_generations") == 0
    for name in ("specdec_coordinator_draft_fallbacks_total",
                 "specdec_coordinator_target_repins_total"):
        assert c(name) == 0, name
    for rpc in ("propose", "verify"):
        assert c("specdec_coordinator_resyncs_total", rpc=rpc) == 0

    # -- target --------------------------------------------------------------------------
    fed = t("specdec_target_tokens_fed_total")
    assert fed == sum(target.fed)
    # Each round feeds what the target lacks plus the drafts; the last token is never fed.
    assert fed == len(PROMPT) + stats.drafted_tokens + stats.rounds - 1
    assert fed >= len(PROMPT) + generated  # rejected drafts were fed, then rolled back
    assert t("specdec_target_forward_duration_seconds_count") == len(target.fed)
    assert t("specdec_target_forward_duration_seconds_sum") > 0
    assert t("specdec_target_verify_batch_size_count") == len(target.fed)
    assert t("specdec_target_verify_batch_size_sum") == len(target.fed)  # one request each
    assert inflight_seen == [1.0] * len(target.fed)
    assert t.after("specdec_target_inflight_verify_requests") == 0
    assert [live for *_, live in rounds] == [1.0] * len(rounds)
    assert t.after("specdec_target_live_sessions") == 0
    assert t.after("specdec_target_busy_sessions") == 0
    assert t("specdec_target_released_sessions_total") == 1
    for reason in ("idle", "memory"):
        assert t("specdec_target_session_evictions_total", reason=reason) == 0

    # -- draft ---------------------------------------------------------------------------
    assert d("specdec_draft_tokens_fed_total") == sum(draft.fed)
    assert d("specdec_draft_tokens_fed_total") >= len(PROMPT) + stats.drafted_tokens \
        - len(draft.fed)
    # One prefill and K - 1 steps per Propose: one forward pass per drafted token.
    assert d("specdec_draft_forward_duration_seconds_count") == stats.drafted_tokens
    assert [live for _, _, live, _ in rounds[:-1]] == [1.0] * (len(rounds) - 1)
    assert d.after("specdec_draft_live_sessions") == 0
    assert d("specdec_draft_released_sessions_total") == 1
    assert not d.after.has("specdec_draft_inflight_verify_requests")
    assert not d.after.has("specdec_target_inflight_verify_requests")


def test_faults_are_counted_where_the_loop_counts_them(services):
    """A draft failure, a target failure (re-pin) and lost sessions (resyncs): each
    metric equals the loop's own count and the failed attempts are timed too."""
    (d_addr, d_engine), (t_addr, t_engine) = services
    metrics = PrometheusLoopMetrics()
    port = metrics.serve(free_port(), "127.0.0.1")
    try:
        with grpc.insecure_channel(d_addr) as d_ch, grpc.insecure_channel(t_addr) as t_ch:
            # INTERNAL: the draft stays pinned and is retried the next round (no back-off).
            draft = CountingDraft(d_ch, fail_on={2}, fail_code=grpc.StatusCode.INTERNAL)
            # Two replicas, one server: "t-a" is pinned first and fails its 3rd call.
            first, second = CountingTarget(t_ch, fail_on={3}), CountingTarget(t_ch)
            target = Router.from_clients({"t-a": first, "t-b": second})
            loop = SpeculativeLoop(draft, target, LoopPolicy(pipeline=False), draft_backoff_s=0.0,
                                   metrics=metrics)
            rounds = 0

            def evict(_tokens, _kinds):
                nonlocal rounds
                rounds += 1
                if rounds == 6:
                    for store in (d_engine.model.store, t_engine.model.store):
                        for session_id in list(store._idle):
                            store.release(session_id)

            before = Samples(port)
            result = loop.generate(PROMPT, 40, GREEDY, num_draft_tokens=K, on_tokens=evict)
            c = Delta(before, Samples(port))
    finally:
        metrics.close()
    stats = result.stats
    assert stats.draft_fallbacks == 1 and stats.target_repins == 1
    assert draft.resync_errors >= 1 and second.resync_errors >= 1  # both lost their session
    assert c("specdec_coordinator_draft_fallbacks_total") == stats.draft_fallbacks
    assert c("specdec_coordinator_target_repins_total") == stats.target_repins
    assert c("specdec_coordinator_resyncs_total", rpc="propose") == draft.resync_errors
    assert c("specdec_coordinator_resyncs_total", rpc="verify") \
        == first.resync_errors + second.resync_errors
    assert (c("specdec_coordinator_resyncs_total", rpc="propose")
            + c("specdec_coordinator_resyncs_total", rpc="verify")) == stats.resyncs
    assert c("specdec_coordinator_rpc_duration_seconds_count", rpc="propose") == draft.attempts
    assert c("specdec_coordinator_rpc_duration_seconds_count", rpc="verify") \
        == first.attempts + second.attempts
    assert c("specdec_spec_decode_num_drafts_total") == len(draft.fed)
    assert c("specdec_spec_decode_num_draft_tokens_total") == stats.drafted_tokens
    assert c("specdec_spec_decode_num_accepted_tokens_total") == stats.accepted_tokens
    assert c("specdec_coordinator_round_duration_seconds_count") == stats.rounds
    assert c.after("specdec_coordinator_active_generations") == 0


def test_evictions_are_counted_by_reason(services):
    """A session past its TTL counts as an idle eviction, not a release."""
    _, (t_addr, t_engine) = services
    store = t_engine.model.store
    port = t_engine.model.metrics.port
    before = Samples(port)
    with grpc.insecure_channel(t_addr) as ch:
        TargetClient(ch).stub.Verify(_verify_request("evict-me"), timeout=10)
    live = "specdec_target_live_sessions"
    assert Samples(port)(live) == before(live) + 1
    ttl = store.ttl_s
    store.ttl_s = -1.0  # every idle session is past it
    try:
        assert store.evict_expired() >= 1
    finally:
        store.ttl_s = ttl
    delta = Delta(before, Samples(port))
    assert delta("specdec_target_session_evictions_total", reason="idle") >= 1
    assert delta("specdec_target_session_evictions_total", reason="memory") == 0
    assert delta("specdec_target_released_sessions_total") == 0
    assert delta.after("specdec_target_live_sessions") == 0


def test_verify_batch_size_and_inflight_count_every_request(services, monkeypatch):
    """The engine's batch entry point (gRPC sends batches of one): a batch of three, one
    of them invalid, is one batch of 3 and 3 requests in flight until it returns, even
    when a request fails outright."""
    from target_service.engine import VerifyArgs

    _, (_, engine) = services
    port = engine.model.metrics.port
    batch = [VerifyArgs(session_id=f"batch-{i}", keep_len=0, keep_digest=0,
                        new_tokens=[1, 2, 3]) for i in range(2)]
    batch.append(VerifyArgs(session_id="batch-bad", keep_len=0, keep_digest=0,
                            new_tokens=[]))  # INVALID_ARGUMENT, reported in its slot
    before = Samples(port)
    inflight_seen: list[float] = []
    sync = engine.model.sync

    def look_then_sync(*args, **kwargs):
        inflight_seen.append(Samples(port)("specdec_target_inflight_verify_requests"))
        return sync(*args, **kwargs)

    monkeypatch.setattr(engine.model, "sync", look_then_sync)
    results = engine.verify_batch(batch)
    for args in batch:
        engine.release(args.session_id)
    assert [isinstance(r, Exception) for r in results] == [False, False, True]
    assert inflight_seen == [3.0, 3.0]
    delta = Delta(before, Samples(port))
    assert delta("specdec_target_verify_batch_size_count") == 1
    assert delta("specdec_target_verify_batch_size_sum") == 3
    assert delta("specdec_target_verify_batch_size_bucket", le="2.0") == 0
    assert delta("specdec_target_verify_batch_size_bucket", le="4.0") == 1
    assert delta.after("specdec_target_inflight_verify_requests") == 0

    def broken(*_args, **_kwargs):
        raise RuntimeError("the model fell over")

    monkeypatch.setattr(engine.model, "sync", broken)
    with pytest.raises(RuntimeError):
        engine.verify_batch(batch[:1])
    assert Samples(port)("specdec_target_inflight_verify_requests") == 0


def _verify_request(session_id: str):
    from specdec.v1 import target_pb2

    return target_pb2.VerifyRequest(session_id=session_id, keep_len=0, keep_digest=0,
                                    new_tokens=[1, 2, 3], num_draft=0, round_seed=1)


class _NoServer:
    def shutdown(self):
        pass

    def server_close(self):
        pass


def test_metrics_port_zero_serves_nothing(monkeypatch):
    started = []

    def spy(*args):
        started.append(args)
        return _NoServer(), None

    monkeypatch.setattr(specdec.metrics, "start_http_server", spy)
    server, _, engine = create_draft(DraftConfig(model="tiny-random-draft", port=0))
    server.stop(0)
    assert started == []
    assert type(engine.model.metrics) is ModelMetrics and not engine.model.metrics.enabled
    with grpc.insecure_channel("127.0.0.1:1") as channel:
        assert not SpeculativeLoop(None, TargetClient(channel)).metrics.enabled
    # The spy sees a server started as soon as the port is not 0.
    server, _, engine = create_target(TargetConfig(model="tiny-random", port=0,
                                                   metrics_port=9))
    server.stop(0)
    engine.model.metrics.close()
    assert started == [(9, "127.0.0.1", engine.model.metrics.registry)]


def test_flags_default_to_off():
    from coordinator.config import from_args as coordinator_args
    from draft_service.config import from_args as draft_args
    from target_service.config import from_args as target_args

    for parse, base in ((draft_args, ["--model", "m"]), (target_args, ["--model", "m"]),
                        (coordinator_args, [])):
        assert parse(base).metrics_port == 0
        assert parse([*base, "--metrics-port", "9100"]).metrics_port == 9100


def test_a_taken_port_fails_a_model_service_or_moves_a_replica_on(services, caplog):
    """A model service treats a taken metrics port like a taken gRPC port (start-up
    error); a coordinator replica warns and takes the next free one."""
    host = "0.0.0.0"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"metrics on 127.0.0.1:{port}"):
            PrometheusModelMetrics("draft").serve(port, "127.0.0.1")

    from coordinator.app import Coordinator

    (d_addr, _), (t_addr, _) = services
    for _ in range(20):  # a free port whose successor is free too
        with socket.socket() as taken, socket.socket() as probe:
            taken.bind((host, 0))
            port = taken.getsockname()[1]
            try:
                probe.bind((host, port + 1))
            except OSError:
                continue
            probe.close()
            taken.listen()
            with caplog.at_level(logging.WARNING, logger="specdec.metrics"):
                replica = Coordinator.func_or_class(
                    {"draft": d_addr, "target": t_addr, "metrics_port": port})
            break
    else:
        pytest.fail("no two consecutive free ports")
    try:
        assert replica.metrics.port == port + 1
        assert replica.service.loop.metrics is replica.metrics
        assert any(f"metrics port {host}:{port} is taken" in r.getMessage()
                   for r in caplog.records)
        before = Samples(port + 1)
        from specdec.v1 import generate_pb2

        resp = replica.service.generate(generate_pb2.GenerateRequest(
            prompt_token_ids=PROMPT, max_new_tokens=8, num_draft_tokens=2))
        after = Samples(port + 1)
        delta = Delta(before, after)
        assert len(resp.token_ids) == 8
        assert delta("specdec_spec_decode_num_draft_tokens_total") == resp.stats.drafted_tokens
        assert (delta("specdec_spec_decode_num_accepted_tokens_total")
                == resp.stats.accepted_tokens)
        assert delta("specdec_coordinator_round_duration_seconds_count") == resp.stats.rounds
        assert delta("specdec_coordinator_generated_tokens_total") == 8
    finally:
        replica.__del__()
    with pytest.raises(urllib.error.URLError):
        Samples(port + 1)  # closed with the replica
