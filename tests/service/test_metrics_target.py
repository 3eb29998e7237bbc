"""Target-service metrics: evictions by reason, Verify batch sizes, requests in flight."""

from __future__ import annotations

import grpc
import pytest

from coordinator.clients import TargetClient
from tests.service import _metrics_helpers
from tests.service._metrics_helpers import Delta, Samples

services = _metrics_helpers.services  # the shared fixture: servers for this module


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
