"""Prometheus metrics (--metrics-port): real services and a loop, scraped over HTTP.

The figures each endpoint reports after a short generation are checked against what
the test itself saw: the loop's LoopStats, the rounds it streamed, and the requests the
clients sent (counted by wrapping the clients, independently of the metrics code).
"""

from __future__ import annotations

import grpc

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from coordinator.remote.clients import DraftClient, TargetClient
from coordinator.remote.routing import Router
from specdec.contrastive import ContrastiveParams
from specdec.metrics import PrometheusLoopMetrics
from specdec.sampling import SamplingParams
from specdec.verify import TokenKind
from tests.service import _metrics_helpers
from tests.service._metrics_helpers import PROMPT, Delta, Samples, free_port

GREEDY = SamplingParams()
K = 4
services = _metrics_helpers.services  # the shared fixture: servers for this module

MODEL_ONLY = LoopPolicy(pipeline=False, drafter="model")  # sequential, no look-up


class Counting:
    """A client that counts its calls (each item of a batch call is one): attempts,
    resync errors, and per successful one the tokens the server must feed. Attempts
    numbered in `fail_on` (from 1) fail."""

    def __init__(self, channel, fail_on=(), fail_code=grpc.StatusCode.UNAVAILABLE):
        super().__init__(channel)
        self.fail_on, self.fail_code = set(fail_on), fail_code
        self.attempts = self.resync_errors = 0
        self.fed: list[int] = []

    def _batch(self, method, req, field):
        """A batch call, each item counted as an attempt of its own; an item whose attempt
        is in `fail_on` is not sent and fails as a call of its own would have (the
        replica failed it)."""
        numbers = []
        for _ in req.items:
            self.attempts += 1
            numbers.append(self.attempts)
        sent = type(req)(items=[item for item, n in zip(req.items, numbers, strict=True)
                                if n not in self.fail_on])
        call = super()._batch(method, sent, field) if sent.items else None
        return CountedCall(self, call, numbers, req)


class CountedCall:
    """What a Counting client's batch call returns: its outcomes with the injected
    failures put back in place, and the counts taken."""

    def __init__(self, client: Counting, call, numbers: list[int], request):
        self.client, self.call, self.numbers, self.request = client, call, numbers, request
        self.seconds = 0.0

    def outcomes(self, timeout=None):
        from coordinator.remote.clients import ItemFailure

        real = iter(self.call.outcomes(timeout) if self.call is not None else ())
        self.seconds = self.call.seconds if self.call is not None else 0.0
        out = []
        for item, n in zip(self.request.items, self.numbers, strict=True):
            if n in self.client.fail_on:
                out.append(ItemFailure(self.client.fail_code, "injected failure", whole=True))
                continue
            outcome = next(real)
            if isinstance(outcome, ItemFailure):
                if outcome.code in (grpc.StatusCode.FAILED_PRECONDITION,
                                    grpc.StatusCode.NOT_FOUND):
                    self.client.resync_errors += 1
            else:
                self.client.fed.append(self.client.fed_by(item))
            out.append(outcome)
        return out


class CountingDraft(Counting, DraftClient):
    @staticmethod
    def fed_by(item) -> int:
        return len(item.new_tokens) + item.num_tokens - 1  # K - 1 steps after


class CountingTarget(Counting, TargetClient):
    @staticmethod
    def fed_by(item) -> int:
        return len(item.new_tokens)  # the committed tail and the drafts


def test_a_generation_moves_every_endpoint_consistently(services, monkeypatch):
    (d_addr, d_engine), (t_addr, t_engine) = services
    d_port, t_port = d_engine.model.metrics.port, t_engine.model.metrics.port
    loop_metrics = PrometheusLoopMetrics()
    c_port = loop_metrics.serve(free_port(), "127.0.0.1")
    try:
        with grpc.insecure_channel(d_addr) as d_ch, grpc.insecure_channel(t_addr) as t_ch:
            draft, target = CountingDraft(d_ch), CountingTarget(t_ch)
            # The draft model drafts every round (each Propose is counted against them).
            loop = SpeculativeLoop(draft, target, MODEL_ONLY, metrics=loop_metrics)
            before = [Samples(p) for p in (c_port, d_port, t_port)]

            # Inside each Verify, just before the target's forward pass: its gauge.
            inflight_seen: list[float] = []
            feed = t_engine.model.feed_many

            def look_then_feed(*args, **kwargs):
                inflight_seen.append(Samples(t_port)("specdec_target_inflight_verify_requests"))
                return feed(*args, **kwargs)

            monkeypatch.setattr(t_engine.model, "feed_many", look_then_feed)

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
    assert c("specdec_coordinator_round_draft_tokens_count") == stats.rounds
    assert c("specdec_coordinator_round_draft_tokens_sum") == stats.drafted_tokens
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
    # One generation alone: every pass holds one session.
    assert t("specdec_target_batch_sessions_count") == len(target.fed)
    assert t("specdec_target_batch_sessions_sum") == len(target.fed)
    assert t("specdec_target_batch_tokens_sum") == fed
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
            loop = SpeculativeLoop(draft, target, MODEL_ONLY, draft_backoff_s=0.0,
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


def test_contrastive_rounds_report_the_plausible_set_sizes(services):
    (d_addr, _), (t_addr, _) = services
    loop_metrics = PrometheusLoopMetrics()
    c_port = loop_metrics.serve(free_port(), "127.0.0.1")
    try:
        with grpc.insecure_channel(d_addr) as d_ch, grpc.insecure_channel(t_addr) as t_ch:
            loop = SpeculativeLoop(DraftClient(d_ch), TargetClient(t_ch),
                                   MODEL_ONLY, metrics=loop_metrics)
            before = Samples(c_port)
            result = loop.generate(PROMPT, 12, GREEDY, num_draft_tokens=2,
                                   contrastive=ContrastiveParams())
            c = Delta(before, Samples(c_port))
    finally:
        loop_metrics.close()
    stats = result.stats
    assert c("specdec_coordinator_contrastive_head_size_count") == stats.head_positions > 0
    assert c("specdec_coordinator_contrastive_head_size_sum") == stats.head_ids
