"""Target-service metrics: evictions by reason, batch sizes, queue waits, requests in flight."""

from __future__ import annotations

import grpc
import pytest

from coordinator.remote.clients import TargetClient
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


def test_batch_metrics_and_inflight_count_every_request(services, monkeypatch):
    """Three concurrent Verify requests while a pass runs: the first pass holds one, the
    next holds the two that queued meanwhile. The histograms say so, queue waits are
    timed, and the in-flight gauge counts all three until each returns, even one that
    fails outright."""
    import threading

    from target_service.engine import VerifyArgs

    _, (_, engine) = services
    port = engine.model.metrics.port
    backend = engine.model.backend
    first_pass, release = threading.Event(), threading.Event()
    forward_batch = backend.forward_batch

    def held(items):
        if not first_pass.is_set():
            first_pass.set()
            release.wait(10)
        return forward_batch(items)

    monkeypatch.setattr(engine.model.scheduler, "_forward_batch", held)
    requests = [VerifyArgs(session_id=f"batch-{i}", keep_len=0, keep_digest=0,
                           new_tokens=[1, 2, 3]) for i in range(3)]
    before = Samples(port)
    results: dict[int, object] = {}

    def verify(i):
        results[i] = engine.verify(requests[i])

    threads = [threading.Thread(target=verify, args=(0,))]
    threads[0].start()
    assert first_pass.wait(10)
    threads += [threading.Thread(target=verify, args=(i,)) for i in (1, 2)]
    for t in threads[1:]:
        t.start()
    while Samples(port)("specdec_target_inflight_verify_requests") < 3:
        pass  # all three counted while the first pass is held
    release.set()
    for t in threads:
        t.join(10)
    for args in requests:
        engine.release(args.session_id)
    assert sorted(results) == [0, 1, 2]
    delta = Delta(before, Samples(port))
    assert delta("specdec_target_batch_sessions_count") == 2  # two passes
    assert delta("specdec_target_batch_sessions_sum") == 3
    assert delta("specdec_target_batch_sessions_bucket", le="1.0") == 1
    assert delta("specdec_target_batch_tokens_sum") == 9
    assert delta("specdec_target_queue_wait_seconds_count") == 3
    assert delta("specdec_target_queue_wait_seconds_sum") > 0
    assert delta.after("specdec_target_inflight_verify_requests") == 0

    def broken(_items):
        raise RuntimeError("the model fell over")

    monkeypatch.setattr(engine.model.scheduler, "_forward_batch", broken)
    with pytest.raises(RuntimeError):
        engine.verify(VerifyArgs(session_id="broken", keep_len=0, keep_digest=0,
                                 new_tokens=[1]))
    assert Samples(port)("specdec_target_inflight_verify_requests") == 0


def _verify_request(session_id: str):
    from specdec.v1 import target_pb2

    return target_pb2.VerifyRequest(session_id=session_id, keep_len=0, keep_digest=0,
                                    new_tokens=[1, 2, 3], num_draft=0, round_seed=1)
